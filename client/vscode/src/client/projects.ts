// A project as fwaid reads it (Projects.GetConfig): its .fwai/project.yaml.
import { FwaiClient } from './connection';

/** The project's configuration (.fwai/project.yaml) as YAML text. */
export async function getProjectConfig(client: FwaiClient, projectRoot: string): Promise<string> {
  const r = await client.call('Projects', 'GetConfig', { project_root: projectRoot });
  return r.yaml;
}

/** The image a project configuration names (`flash.image`; '' when it names none): what Flash writes by default. */
export function configuredImage(yaml: string): string {
  return /^\s*image:\s*["']?([^"'\n#]+?)["']?\s*(#.*)?$/m.exec(yaml)?.[1].trim() ?? '';
}
