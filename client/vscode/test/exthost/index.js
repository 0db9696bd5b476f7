// The extension-host suite: runs inside VS Code (loaded through the
// workbench's extensionTestsPath, as @vscode/test-electron does) with the full
// `vscode` API, against the e2e run's fwaid and fake LLM service, in a
// multi-root workspace (the firmware project and a second project).
// A browser workbench has no exit code: results go to $E2E_RESULTS_FILE.
const vscode = require('vscode');
const assert = require('assert');
const fs = require('fs');
const path = require('path');

const EXT_ID = 'fwai.fwai-vscode';
const FAKE = process.env.E2E_FAKE_URL;
const PROJECT = process.env.E2E_PROJECT;
const PROJECT2 = process.env.E2E_PROJECT2;
let api;
const metrics = {};

async function enqueue(replies) {
  const r = await fetch(`${FAKE}/_fake/replies`, { method: 'POST', body: JSON.stringify(replies) });
  if (!r.ok) throw new Error(await r.text());
}
async function until(pred, what, ms = 30000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const v = await pred();
    if (v) return v;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${typeof what === 'function' ? what() : what}`);
}
// The editor's document for `file`, holding what is on disk. A scenario
// before may have written the file behind an open document; VS Code reloads
// it when its watcher says so, which under load can come late, and a save
// before then is refused as a conflict. Reverting reloads it now.
async function showAsOnDisk(file) {
  const doc = await vscode.workspace.openTextDocument(file);
  const ed = await vscode.window.showTextDocument(doc);
  // Reverted even when its text already matches the disk: a revert reads the
  // file again, so the editor's idea of when it was written is current and a
  // save from this test is not refused as a conflict with an earlier write.
  await vscode.commands.executeCommand('workbench.action.files.revert');
  await until(
    () => !doc.isDirty && doc.getText() === fs.readFileSync(file, 'utf8'),
    `${file} as on disk in its editor`,
  );
  return { doc, ed };
}
// A picture of this window for the docs, taken by the runner (which alone
// drives the browser): `NAME.want` in $E2E_SHOTS asks for NAME.png once
// `text` shows; the runner removes the request when the picture is taken.
async function shot(name, text) {
  const dir = process.env.E2E_SHOTS;
  if (!dir) return;
  await vscode.commands.executeCommand('fwai.sessions.focus');
  await vscode.commands.executeCommand('notifications.clearAll');
  const want = path.join(dir, `${name}.want`);
  fs.writeFileSync(`${want}.partial`, JSON.stringify({ text }));
  fs.renameSync(`${want}.partial`, want);
  await until(() => !fs.existsSync(want), `the runner to take picture ${name}`, 20000);
}
function turnFinished(turnId) {
  return new Promise((resolve) => {
    const sub = api.chat.onEvent((ev) => {
      if (ev.payload === 'turn_finished' && ev.turn_id === turnId) {
        sub.dispose();
        resolve(ev);
      }
    });
  });
}
const folder = (root) => vscode.workspace.workspaceFolders.find((f) => f.uri.fsPath === root);

const tests = [
  [
    'the extension activates in the workspace extension host and exports its API',
    async () => {
      const ext = vscode.extensions.getExtension(EXT_ID);
      assert.ok(ext, 'extension not found');
      api = await ext.activate();
      assert.ok(ext.isActive);
      assert.equal(ext.extensionKind, vscode.ExtensionKind.Workspace);
      assert.equal(typeof api.activationMs, 'number');
      metrics.activationMs = api.activationMs;
      // fwaid's run logs (a file per tool call) are not watched: a long turn
      // would otherwise send the workbench a file event for each.
      const watcherExclude = vscode.workspace.getConfiguration('files', vscode.Uri.file(PROJECT)).get('watcherExclude');
      assert.equal(watcherExclude['**/.fwai/runs/**'], true, JSON.stringify(watcherExclude));
      const cmds = await vscode.commands.getCommands(true);
      for (const c of [
        'fwai.newSession',
        'fwai.attachSession',
        'fwai.approvePlan',
        'fwai.leaseBoard',
        'fwai.openSerial',
        'fwai.flashBoard',
        'fwai.runSkill',
        'fwai.searchDatasheets',
        'fwai.kbAdd',
        'fwai.exportSarif',
        'fwai.exportHtml',
        'fwai.setToken',
        'fwai.memoryReport',
        'fwai.sbom',
        'fwai.otaStatus',
        'fwai.checkRegisters',
        'fwai.captureFault',
        'fwai.openFaultCapture',
      ]) {
        assert.ok(cmds.includes(c), `${c} is not registered`);
      }
    },
  ],
  [
    'it connects to the daemon named in fwai.daemon',
    async () => {
      const t0 = Date.now();
      const client = await api.connection.get();
      metrics.connectMs = Date.now() - t0;
      assert.equal(api.connection.state, 'connected');
      const st = await client.call('Daemon', 'Status', {});
      assert.match(st.caller, /^uid:/);
    },
  ],
  [
    'multi-root: each folder is its own project (skills tree, tasks, new sessions)',
    async () => {
      // A workspace file on the remote side is read once the remote file system
      // is up, which can be after the extension host started: its folders then
      // arrive through onDidChangeWorkspaceFolders, and the skills tree follows.
      let treeChanged = false;
      const sub = api.skills.onDidChangeTreeData(() => (treeChanged = true));
      const late = (vscode.workspace.workspaceFolders ?? []).length < 2;
      await until(
        () => (vscode.workspace.workspaceFolders ?? []).length >= 2,
        () =>
          `the workspace's two folders (have ${JSON.stringify((vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.fsPath))}, workspace file ${vscode.workspace.workspaceFile})`,
        90000,
      );
      sub.dispose();
      if (late) assert.ok(treeChanged, 'the skills tree did not refresh when the folders arrived');
      metrics.foldersArrivedLate = late;
      assert.equal(vscode.workspace.workspaceFolders.length, 2);
      const roots = await api.skills.getChildren();
      assert.deepEqual(roots.map((n) => n.folder.uri.fsPath).sort(), [PROJECT, PROJECT2].sort());
      const second = await api.skills.getChildren(roots.find((n) => n.folder.uri.fsPath === PROJECT2));
      assert.ok(
        second.some((n) => n.skill.name === 'hello'),
        JSON.stringify(second.map((n) => n.skill && n.skill.name)),
      );
      const first = await api.skills.getChildren(roots.find((n) => n.folder.uri.fsPath === PROJECT));
      assert.ok(!first.some((n) => n.skill.name === 'hello'));
      const tasks = await vscode.tasks.fetchTasks({ type: 'fwai' });
      const names = tasks.map((t) => `${t.scope.name}:${t.definition.skill}`);
      assert.ok(names.includes(`${path.basename(PROJECT)}:build`), names.join(','));
      assert.ok(names.includes(`${path.basename(PROJECT2)}:hello`), names.join(','));
      // A new session works on the folder of the active editor.
      await vscode.window.showTextDocument(vscode.Uri.file(path.join(PROJECT2, 'notes.md')));
      await vscode.commands.executeCommand('fwai.newSession');
      assert.equal(api.chat.projectRoot(), PROJECT2);
    },
  ],
  [
    "a chat turn's edit opens as a diff of the file before and after the call",
    async () => {
      await vscode.window.showTextDocument(vscode.Uri.file(path.join(PROJECT, 'Makefile')));
      await vscode.commands.executeCommand('fwai.newSession');
      assert.equal(api.chat.projectRoot(), PROJECT);
      await enqueue([
        {
          tool_calls: [
            {
              id: 'e1',
              name: 'edit_file',
              input: { path: 'Makefile', old_string: 'VERSION ?= 1.0.0', new_string: 'VERSION ?= 1.1.0' },
            },
          ],
        },
        { chunks: ['Bumped the version.'] },
      ]);
      const turnId = await api.chat.send('bump the version to 1.1.0');
      await turnFinished(turnId);
      assert.equal(api.chat.model.calls.get('e1').status, 'ok');
      await api.edits.showDiff(api.chat, 'e1');
      const tab = await until(() => {
        const t = vscode.window.tabGroups.activeTabGroup.activeTab;
        return t && t.input instanceof vscode.TabInputTextDiff ? t : null;
      }, 'the diff editor');
      assert.equal(tab.input.original.scheme, 'fwai-before');
      const before = (await vscode.workspace.openTextDocument(tab.input.original)).getText();
      const after = fs.readFileSync(path.join(PROJECT, 'Makefile'), 'utf8');
      assert.match(before, /VERSION \?= 1\.0\.0/);
      assert.match(after, /VERSION \?= 1\.1\.0/);
      assert.equal(before.replace('1.0.0', '1.1.0'), after);
      assert.equal(
        api.edits
          .changesOf(api.chat)
          .map((c) => c.path)
          .join(),
        'Makefile',
      );
      // The version goes back for the other scenarios.
      fs.writeFileSync(path.join(PROJECT, 'Makefile'), before);
    },
  ],
  [
    "a turn's changes reviewed against the checkpoint before it: bash-made ones too, a hunk kept, one reverted, a file reverted",
    async () => {
      const main = path.join(PROJECT, 'src', 'main.c');
      const mainBefore = fs.readFileSync(main, 'utf8');
      // Two changes far apart in src/main.c (two hunks), a new file, and one made by bash.
      const first = mainBefore.split('\n')[0];
      const last = 'rtt_puts(RTT_TRACE, "tick counter=");';
      try {
        await enqueue([
          {
            tool_calls: [
              {
                id: 'h1',
                name: 'edit_file',
                input: { path: 'src/main.c', old_string: first, new_string: `${first} (one)` },
              },
              {
                id: 'h2',
                name: 'edit_file',
                input: { path: 'src/main.c', old_string: last, new_string: `${last} /* two */` },
              },
              { id: 'n1', name: 'write_file', input: { path: 'review-new.txt', content: 'made in the turn\n' } },
              { id: 'b1', name: 'bash', input: { command: 'echo by-bash > review-bash.txt' } },
            ],
          },
          { chunks: ['Changed four files.'] },
        ]);
        const turnId = await api.chat.send('change some files for the review');
        await turnFinished(turnId);
        const files = await api.review.start(turnId);
        const byPath = Object.fromEntries(files.map((f) => [f.path, f.action]));
        assert.deepEqual(byPath, { 'src/main.c': 'restore', 'review-new.txt': 'delete', 'review-bash.txt': 'delete' });
        // The diff: before the turn (as fwaid's checkpoint kept it) ↔ now.
        await api.review.openDiff('src/main.c');
        const tab = await until(() => {
          const t = vscode.window.tabGroups.activeTabGroup.activeTab;
          return t && t.input instanceof vscode.TabInputTextDiff ? t : null;
        }, 'the review diff');
        assert.equal(tab.input.original.scheme, 'fwai-turn-before');
        assert.equal((await vscode.workspace.openTextDocument(tab.input.original)).getText(), mainBefore);
        assert.equal(tab.input.modified.fsPath, main);
        await shot('review-diff', 'before the turn ↔ now');
        // Two hunks, each with Keep / Revert lenses in the file's editor.
        let hunks = await api.review.hunks('src/main.c');
        assert.equal(hunks.length, 2);
        const doc = await vscode.workspace.openTextDocument(main);
        const lenses = await vscode.commands.executeCommand('vscode.executeCodeLensProvider', doc.uri);
        assert.ok(lenses.filter((l) => l.command?.command === 'fwai.revertHunk').length >= 2);
        // Keep the first, revert the second: the file holds the first change only, on disk.
        await vscode.commands.executeCommand('fwai.keepHunk', 'src/main.c', 0);
        await vscode.commands.executeCommand('fwai.revertHunk', 'src/main.c', 0);
        const now = fs.readFileSync(main, 'utf8');
        assert.ok(now.includes(`${first} (one)`), 'the kept hunk stays');
        assert.ok(!now.includes('/* two */'), 'the reverted hunk is gone');
        assert.equal(now, mainBefore.replace(first, `${first} (one)`));
        assert.ok(!api.review.review.files.has('src/main.c'), 'every hunk decided: the file leaves the review');
        // A file made by bash, reverted whole by fwaid (as the session's account): gone.
        await api.review.revertFile('review-bash.txt');
        assert.ok(!fs.existsSync(path.join(PROJECT, 'review-bash.txt')));
        // Kept as the turn left it.
        api.review.keepFile('review-new.txt');
        assert.ok(fs.existsSync(path.join(PROJECT, 'review-new.txt')));
        assert.equal(api.review.review.files.size, 0);
      } finally {
        fs.writeFileSync(main, mainBefore);
        fs.rmSync(path.join(PROJECT, 'review-new.txt'), { force: true });
        fs.rmSync(path.join(PROJECT, 'review-bash.txt'), { force: true });
      }
    },
  ],
  [
    'ask before edits: the edit waits for Accept in VS Code; its diff shows what it would do; Reject leaves the file',
    async () => {
      const mk = path.join(PROJECT, 'Makefile');
      const before = fs.readFileSync(mk, 'utf8');
      await vscode.commands.executeCommand('fwai.newSession');
      await api.chat.setEditApproval(true);
      assert.equal(api.chat.model.askBeforeEdits, true);
      await enqueue([
        {
          tool_calls: [
            {
              id: 'a1',
              name: 'edit_file',
              input: { path: 'Makefile', old_string: 'VERSION ?= 1.0.0', new_string: 'VERSION ?= 2.0.0' },
            },
            { id: 'a2', name: 'write_file', input: { path: 'asked.txt', content: 'no\n' } },
          ],
        },
        { chunks: ['One accepted, one not.'] },
      ]);
      const turnId = await api.chat.send('bump the version, and write asked.txt');
      assert.equal(api.chat.session.ask_before_edits, true, 'the session was created asking');
      const q1 = await until(
        () => api.chat.model.question?.edit?.call_id === 'a1' && api.chat.model.question,
        'the first edit to wait',
      );
      assert.equal(q1.edit.path, 'Makefile');
      assert.match(q1.edit.preview, /^-VERSION \?= 1\.0\.0$/m);
      assert.match(q1.edit.preview, /^\+VERSION \?= 2\.0\.0$/m);
      assert.equal(fs.readFileSync(mk, 'utf8'), before, 'nothing written before the accept');
      // Its diff: the file now ↔ as the edit would leave it.
      await api.edits.showProposed(api.chat, 'a1');
      const tab = await until(() => {
        const t = vscode.window.tabGroups.activeTabGroup.activeTab;
        return t && t.input instanceof vscode.TabInputTextDiff ? t : null;
      }, 'the proposed diff');
      assert.equal(tab.input.original.fsPath, mk);
      assert.equal(
        (await vscode.workspace.openTextDocument(tab.input.modified)).getText(),
        before.replace('1.0.0', '2.0.0'),
      );
      await shot('ask-before-edits', 'proposed by main');
      api.chat.stream.answer(q1.questionId, ['Accept'], '');
      const q2 = await until(
        () => api.chat.model.question?.edit?.call_id === 'a2' && api.chat.model.question,
        'the second edit to wait',
      );
      api.chat.stream.answer(q2.questionId, ['Reject'], 'not wanted');
      await turnFinished(turnId);
      assert.match(fs.readFileSync(mk, 'utf8'), /VERSION \?= 2\.0\.0/);
      assert.ok(!fs.existsSync(path.join(PROJECT, 'asked.txt')));
      assert.match(api.chat.model.calls.get('a2').result, /rejected.*not wanted/s);
      fs.writeFileSync(mk, before);
      // Off again for the scenarios that follow.
      await api.chat.setEditApproval(false);
      await until(() => api.chat.model.askBeforeEdits === false, 'asking off');
    },
  ],
  [
    'file:line references open the file at that line',
    async () => {
      await api.chat.openRef('src/main.c', 7, 3);
      const ed = vscode.window.activeTextEditor;
      assert.equal(ed.document.uri.fsPath, path.join(PROJECT, 'src', 'main.c'));
      assert.equal(ed.selection.active.line, 6);
      assert.equal(ed.selection.active.character, 2);
    },
  ],
  [
    'a question is answered from VS Code and the turn goes on',
    async () => {
      await enqueue([
        {
          tool_calls: [
            {
              id: 'q1',
              name: 'askQuestion',
              input: { questions: [{ text: 'Which baud rate?', options: ['9600', '115200'] }] },
            },
          ],
        },
        { chunks: ['Using 115200.'] },
      ]);
      const turnId = await api.chat.send('set up the console');
      const done = turnFinished(turnId);
      await until(() => api.chat.model.question, 'the question');
      api.chat.stream.answer(api.chat.model.question.questionId, ['115200']);
      await done;
      assert.match(api.chat.model.calls.get('q1').result, /115200/);
      assert.match(api.chat.model.lastResolution.by, /via vscode/);
    },
  ],
  [
    'datasheets: a file added from the explorer is found and opens at the cited lines',
    async () => {
      const doc = path.join(PROJECT2, 'docs', 'usart.md');
      const r = await api.knowledge.add([vscode.Uri.file(path.dirname(doc))]);
      assert.equal(r.failed.length, 0, r.failed.join('\n'));
      assert.ok(r.added + r.unchanged >= 1);
      const client = await api.connection.get();
      const found = await client.call('Knowledge', 'Search', { query: 'USART_BRR mantissa fraction', max_results: 5 });
      const hit = found.results.find((x) => x.doc === doc);
      assert.ok(hit, JSON.stringify(found.results.map((x) => x.doc)));
      await api.knowledge.openResult(hit);
      const ed = vscode.window.activeTextEditor;
      assert.equal(ed.document.uri.fsPath, doc);
      assert.equal(ed.selection.start.line, Math.max(0, hit.start_line - 1));
    },
  ],
  [
    'a skill run through the API puts its typed diagnostics in Problems',
    async () => {
      const bad = path.join(PROJECT2, 'bad.c');
      const r = await api.skills.run(folder(PROJECT2), { type: 'fwai', skill: 'lint' }, () => {});
      assert.equal(r.ok, false);
      const d = r.diagnostics.find((x) => x.file.endsWith('bad.c'));
      assert.ok(d, JSON.stringify(r.diagnostics));
      const inProblems = vscode.languages.getDiagnostics(vscode.Uri.file(bad));
      assert.ok(
        inProblems.some(
          (x) =>
            x.severity === vscode.DiagnosticSeverity.Error &&
            x.range.start.line === d.line - 1 &&
            /fwai lint/.test(x.source),
        ),
        JSON.stringify(inProblems),
      );
    },
  ],
  [
    'evidence: runs listed, the log verifies, SARIF goes to Problems, the HTML report opens',
    async () => {
      await api.evidence.refresh();
      assert.ok(api.evidence.runs.length >= 3, `${api.evidence.runs.length} records`);
      assert.ok(api.evidence.runs.some((r) => JSON.parse(r.record_json).kind === 'agent_turn'));
      await api.evidence.verifyLog();
      assert.equal(api.evidence.verify.ok, true, api.evidence.verify.detail);
      const n = await api.evidence.exportSarif();
      assert.ok(n >= 1);
      const diags = vscode.languages.getDiagnostics(vscode.Uri.file(path.join(PROJECT2, 'bad.c')));
      assert.ok(
        diags.some((x) => /fwai evidence/.test(x.source)),
        JSON.stringify(diags),
      );
      const doc = await api.evidence.open(api.evidence.runs[0].run_id);
      assert.equal(doc.languageId, 'json');
      assert.ok(JSON.parse(doc.getText()).leaf_hash);
      const panel = await api.evidence.showHtml();
      assert.match(panel.webview.html, /fwai evidence/);
      panel.dispose();
    },
  ],
  [
    "register truth: a wrong bit saved in a C file is in Problems with the SVD's truth, and gone once fixed",
    async () => {
      const file = path.join(PROJECT, 'src', 'main.c');
      const before = fs.readFileSync(file, 'utf8');
      const ours = (uri) =>
        vscode.languages.getDiagnostics(uri).filter((d) => String(d.source).startsWith('fwai registers'));
      // What is tried here is what a save makes fwai do, not how VS Code
      // guards a save. The scenarios before rewrote this file behind its
      // editor, and an editor whose idea of the file's time is ahead of the
      // disk's refuses a save as a conflict even after a revert (it keeps the
      // later time). Saves overwrite the disk for this scenario.
      const files = vscode.workspace.getConfiguration('files');
      await files.update('saveConflictResolution', 'overwriteFileOnDisk', vscode.ConfigurationTarget.Global);
      try {
        const { doc } = await showAsOnDisk(file);
        const replace = async (from, to) => {
          const at = doc.getText().indexOf(from);
          assert.ok(at >= 0, from);
          // A workspace edit, not the editor's: it applies whichever editor
          // has the focus and whatever version the document has reached.
          const edit = new vscode.WorkspaceEdit();
          edit.replace(doc.uri, new vscode.Range(doc.positionAt(at), doc.positionAt(at + from.length)), to);
          assert.ok(await vscode.workspace.applyEdit(edit), `the edit to ${file} was applied`);
          assert.ok(doc.isDirty && doc.getText().includes(to), `${file} holds the edit, unsaved`);
          const saved = await doc.save();
          const disk = fs.readFileSync(file, 'utf8');
          assert.ok(
            saved,
            `${file} saved (the editor ${doc.isDirty ? 'still dirty' : 'clean'} at version ${doc.version}; ` +
              `the disk ${disk.includes(to) ? 'holds' : 'lacks'} the edit)`,
          );
        };
        // Saving checks the folder (fwai.checkRegistersOnSave).
        await replace('RCC_APB2ENR_USART1EN (1u << 14)', 'RCC_APB2ENR_USART1EN (1u << 13)');
        const found = await until(() => {
          const d = ours(doc.uri).filter((x) => x.code === 'field-position');
          return d.length ? d : null;
        }, 'the register finding in Problems');
        assert.equal(found[0].range.start.line, 16);
        assert.equal(found[0].severity, vscode.DiagnosticSeverity.Error);
        assert.match(found[0].message, /RCC\.APB2ENR\.USART1EN is bit 14/);
        assert.match(String(found[0].source), /STM32F100\.svd/);
        // Fixed, and checked again through the command's API.
        await replace('RCC_APB2ENR_USART1EN (1u << 13)', 'RCC_APB2ENR_USART1EN (1u << 14)');
        const r = await api.registers.check(PROJECT);
        assert.equal(r.checked.errors, 0, JSON.stringify(r.findings));
        assert.ok(r.checked.accesses >= 10, JSON.stringify(r.checked));
        await until(() => ours(doc.uri).length === 0, 'Problems emptied of the fixed finding');
      } finally {
        fs.writeFileSync(file, before);
        await files.update('saveConflictResolution', undefined, vscode.ConfigurationTarget.Global);
      }
    },
  ],
  [
    'Sessions redraws only when what it shows changes, so a click never lands on a replaced row; a row opens its session',
    async () => {
      let fired = 0;
      const sub = api.sessions.onDidChangeTreeData(() => fired++);
      const client = await api.connection.get();
      let s; // left for the pictures of the connection test: the chat shows it
      try {
        await api.sessions.refresh();
        // Polling with nothing changed: no redraw (one try of three may
        // cross a change of its own, such as "just now" becoming "1m ago").
        let quiet = false;
        for (let i = 0; i < 3 && !quiet; ++i) {
          fired = 0;
          await api.sessions.refresh();
          await api.sessions.refresh();
          quiet = fired === 0;
        }
        assert.ok(quiet, `redrawn ${fired} times with nothing changed`);
        // Counted from before the create: the view's own poll may list the new
        // session before the create's answer is read here.
        fired = 0;
        s = await client.call('Sessions', 'Create', { title: 'a row to click', mode: 'act', project_root: PROJECT });
        await api.sessions.refresh();
        assert.ok(fired >= 1, 'a new session was not drawn');
        const find = (nodes) =>
          nodes.flatMap((n) => (n.kind === 'group' ? api.sessions.getChildren(n) : [n])).find((n) => n.s?.id === s.id);
        const row = find(api.sessions.getChildren());
        assert.ok(row, 'the new session is not listed');
        const cmd = api.sessions.getTreeItem(row).command;
        await vscode.commands.executeCommand(cmd.command, ...(cmd.arguments ?? []));
        await until(() => api.chat.session?.id === s.id, 'the clicked session to open in the chat');
      } finally {
        sub.dispose();
      }
    },
  ],
  [
    'boards: lease, renew and release through the API; the status says who holds it',
    async () => {
      await api.boards.refresh();
      const board = api.boards.devices.find((d) => d.id === 'sim-stm32vl');
      assert.ok(board);
      if (api.boards.heldByMe(board.id)) await api.boards.release(board);
      const l = await api.boards.lease(board);
      assert.ok(l.lease_id);
      assert.ok(api.boards.heldByMe(board.id));
      const item = api.boards.getTreeItem(api.boards.devices.find((d) => d.id === 'sim-stm32vl'));
      assert.equal(item.contextValue, 'board-mine');
      assert.match(String(item.description), /held by you/);
      await api.boards.renew(board);
      // A terminal on a channel named by the caller needs no pick; it is named as the listing
      // names the channel (the board runs the example since the serial terminal's scenario).
      const term = await api.boards.openSerial(board, 'rtt:0');
      assert.equal(term.name, 'fwai RTT 0 · Terminal: sim-stm32vl');
      assert.ok(vscode.window.terminals.includes(term));
      term.dispose();
      // A capture of the held board, kept in the project and opened as a report
      // (decoded by the fwai CLI, offline, as `fwai fault decode` would).
      const report = await vscode.commands.executeCommand('fwai.captureFault', board, PROJECT);
      assert.ok(report, 'no report opened');
      assert.match(report.getText(), /^# Fault on sim-stm32vl/);
      // Halted where it ran: in thread mode or in an interrupt handler, not in a fault.
      assert.match(report.getText(), /not (in )?a fault handler/);
      assert.match(report.getText(), /\*\*main\*\* at `src\/main\.c:\d+`/);
      assert.equal(vscode.window.activeTextEditor?.document, report);
      const kept = fs.readdirSync(path.join(PROJECT, '.fwai', 'captures'));
      assert.ok(
        kept.some((f) => /^sim-stm32vl-\d{8}-\d{6}\.fwcap$/.test(f)),
        JSON.stringify(kept),
      );
      await api.boards.release(board);
      assert.equal(api.boards.heldByMe(board.id), undefined);
    },
  ],
  [
    'a lab daemon over TLS: a wrong CA, no token, a malformed one, an expired one, one revoked in use, each said with what to do; the views and the chat follow the connection',
    async () => {
      const cfg = () => vscode.workspace.getConfiguration('fwai');
      const G = vscode.ConfigurationTarget.Global;
      const home = cfg().get('daemon');
      const sessionsSay = async () => {
        await api.sessions.refresh();
        return api.sessions.message;
      };
      let step = 'start';
      const t0 = Date.now();
      metrics.tlsSteps = [];
      try {
        await vscode.commands.executeCommand('fwai.clearToken');
        // Another lab's CA: not trusted, said with the setting to change; nothing of before is listed.
        step = "Another lab's CA: not trusted, said with the setting to c";
        metrics.tlsSteps.push([Date.now() - t0, step]);
        await cfg().update('caFile', process.env.E2E_TLS_WRONG_CA, G);
        await cfg().update('daemon', process.env.E2E_TLS_ADDRESS, G);
        const untrusted = await until(
          async () => ((await sessionsSay()).includes('not trusted') ? await sessionsSay() : ''),
          'the Sessions view to say the certificate is not trusted',
        );
        assert.match(untrusted, /its certificate is not trusted by the CA in .*other\/ca\.pem \(fwai\.caFile\)/);
        assert.match(untrusted, /Set fwai\.caFile/);
        const rows = api.sessions
          .getChildren()
          .flatMap((n) => (n.kind === 'group' ? api.sessions.getChildren(n) : [n]));
        assert.deepEqual(rows, [], 'sessions of the unix daemon still listed');
        await api.boards.refresh();
        assert.deepEqual(
          api.boards.getChildren().map((d) => d.id),
          [],
          'boards of the unix daemon still listed',
        );
        assert.match(api.boards.message, /not trusted/);
        assert.equal(api.connection.state, 'error');
        await shot('connection-untrusted-ca', 'is not trusted');
        // The right CA, no token: the command that fixes it, not the CLI's hint; the status says error.
        step = 'The right CA, no token: the command that fixes it, not th';
        metrics.tlsSteps.push([Date.now() - t0, step]);
        await cfg().update('caFile', process.env.E2E_TLS_CA, G);
        const noToken = await until(
          async () => ((await sessionsSay()).includes('wants a token') ? await sessionsSay() : ''),
          'the Sessions view to ask for a token',
        );
        assert.match(noToken, /run "fwai: Set Daemon Token"/);
        assert.doesNotMatch(noToken, /FWAI_TOKEN|--token-file/);
        await shot('connection-no-token', 'Set Daemon Token');
        await until(
          () => api.connection.state === 'error',
          () => `state error, is ${api.connection.state}`,
        );
        // A malformed token: the daemon's reason.
        step = "A malformed token: the daemon's reason.";
        metrics.tlsSteps.push([Date.now() - t0, step]);
        await vscode.commands.executeCommand('fwai.setToken', 'fwai_not-a-token');
        await until(
          async () => /the token set in VS Code is malformed/.test(await sessionsSay()),
          'the Sessions view to say the token is malformed',
        );
        await shot('connection-malformed-token', 'is malformed');
        // An expired token: when it expired, and the command.
        step = 'An expired token: when it expired, and the command.';
        metrics.tlsSteps.push([Date.now() - t0, step]);
        await vscode.commands.executeCommand('fwai.setToken', process.env.E2E_TLS_TOKEN_EXPIRED);
        const expired = await until(
          async () => ((await sessionsSay()).includes('expired at') ? await sessionsSay() : ''),
          'the Sessions view to say the token expired',
        );
        assert.match(expired, /run "fwai: Set Daemon Token"/);
        // The right token: connected as alice, and a chat over TLS.
        step = 'The right token: connected as alice, and a chat over TLS.';
        metrics.tlsSteps.push([Date.now() - t0, step]);
        await vscode.commands.executeCommand('fwai.setToken', process.env.E2E_TLS_TOKEN);
        await until(
          async () => (await sessionsSay()) === '' && api.connection.state === 'connected',
          () => `connected, is ${api.connection.state} ${api.connection.detail}`,
        );
        const client = await api.connection.get();
        const s = await client.call('Sessions', 'Create', { title: 'over tls', mode: 'act' });
        await api.chat.open(s.id);
        await until(() => api.chat.streamState === 'open', 'the chat stream over TLS to open');
        // The token replaced by a bad one: the chat leaves the old connection and says why it cannot go on.
        step = 'The token replaced by a bad one: the chat leaves the old ';
        metrics.tlsSteps.push([Date.now() - t0, step]);
        await vscode.commands.executeCommand('fwai.setToken', 'fwai_not-a-token');
        await until(
          () => api.chat.streamState === 'closed',
          () => `the chat to close, is ${api.chat.streamState}`,
        );
        await assert.rejects(api.chat.send('hello?'), /not connected to fwaid: the token set in VS Code is malformed/);
        // A good token again: the chat reopens on the new connection by itself, and a turn goes through.
        step = 'A good token again: the chat reopens on the new connectio';
        metrics.tlsSteps.push([Date.now() - t0, step]);
        await vscode.commands.executeCommand('fwai.setToken', process.env.E2E_TLS_TOKEN);
        await until(
          () => api.chat.streamState === 'open',
          () => `the chat to reopen, is ${api.chat.streamState}`,
        );
        await enqueue([{ chunks: ['over ', 'tls'] }]);
        const turn = await api.chat.send('hello over tls');
        await turnFinished(turn);
        assert.match(api.chat.model.outline(turn), /over tls/);
        // Two users on one lab daemon: bob, from his terminal, has a session and holds the board.
        step = 'Two users: each sees only their own sessions; the board says who holds it';
        metrics.tlsSteps.push([Date.now() - t0, step]);
        const asBob = (...args) =>
          require('child_process').execFileSync(
            process.env.E2E_FWAI,
            ['--daemon', process.env.E2E_TLS_ADDRESS, '--ca-cert', process.env.E2E_TLS_CA, ...args],
            { encoding: 'utf8', env: { ...process.env, FWAI_TOKEN: process.env.E2E_TLS_TOKEN_BOB } },
          );
        await enqueue([{ match: "bob's own session", chunks: ['hello bob'] }]);
        asBob('chat', "bob's own session");
        asBob('hw', 'lease', 'sim-stm32vl', '--ttl', '300');
        try {
          const titles = async () => {
            await api.sessions.refresh();
            return api.sessions.sessions.map((x) => x.title);
          };
          const alices = await titles();
          assert.ok(alices.includes('over tls'), alices.join());
          assert.ok(!alices.includes("bob's own session"), `alice sees bob's session: ${alices.join()}`);
          await api.boards.refresh();
          const held = api.boards.devices.find((d) => d.id === 'sim-stm32vl');
          assert.match(String(api.boards.getTreeItem(held).description), /held by bob/);
          assert.ok(!api.boards.heldByMe('sim-stm32vl'));
          await assert.rejects(api.boards.lease(held), /held by bob/);
          await shot('lab-board-held-by-bob', 'held by bob');
          // Bob's extension: his session, not alice's; the board is his.
          await vscode.commands.executeCommand('fwai.setToken', process.env.E2E_TLS_TOKEN_BOB);
          await until(async () => (await titles()).includes("bob's own session"), 'bob to see his own session');
          assert.ok(!(await titles()).includes('over tls'), "bob sees alice's session");
          await api.boards.refresh();
          assert.ok(api.boards.heldByMe('sim-stm32vl'), 'the board is not shown as held by bob himself');
          assert.match(
            String(api.boards.getTreeItem(api.boards.devices.find((d) => d.id === 'sim-stm32vl')).description),
            /held by you/,
          );
        } finally {
          asBob('hw', 'release', 'sim-stm32vl');
        }
        // Alice shares her session with bob to drive: his message, sent from
        // his terminal, is his in her chat; his VS Code lists the session
        // under Shared with me with its owner and his role, until she unshares.
        step = 'A shared session: each message names its verified author';
        metrics.tlsSteps.push([Date.now() - t0, step]);
        await vscode.commands.executeCommand('fwai.setToken', process.env.E2E_TLS_TOKEN);
        await until(
          async () => (await sessionsSay()) === '' && api.connection.state === 'connected',
          () => `connected as alice again, is ${api.connection.state} ${api.connection.detail}`,
        );
        await api.chat.open(s.id);
        await until(() => api.chat.streamState === 'open', "the chat to open on alice's session");
        const made = await api.sessions.share(s.id, 'bob', 'drive');
        assert.equal(made.role, 'drive');
        const ownRow = api.sessions.sessions.find((x) => x.id === s.id);
        assert.match(String(api.sessions.getTreeItem({ kind: 'session', s: ownRow }).description), /shared with 1/);
        assert.equal(api.sessions.getTreeItem({ kind: 'session', s: ownRow }).contextValue, 'session');
        await enqueue([{ match: 'bob was here', chunks: ["hello bob, in alice's session"] }]);
        asBob('chat', '-s', s.id, 'bob was here');
        const bobs = await until(
          () => api.chat.model.turns.find((t) => t.userText === 'bob was here' && !t.running),
          "bob's turn in alice's chat",
        );
        assert.deepEqual([bobs.author, bobs.authorIsOwner], ['bob', false]);
        assert.ok(api.chat.model.shared, 'the chat does not name the authors');
        const alicesTurn = api.chat.model.turns.find((t) => t.userText === 'hello over tls');
        assert.deepEqual([alicesTurn.author, alicesTurn.authorIsOwner], ['alice', true]);
        await vscode.commands.executeCommand('fwai.setToken', process.env.E2E_TLS_TOKEN_BOB);
        const sharedGroup = await until(async () => {
          await api.sessions.refresh();
          return api.sessions.getChildren().find((g) => g.kind === 'group' && g.label === 'Shared with me');
        }, 'bob to see the session under Shared with me');
        const sharedRow = sharedGroup.sessions.find((x) => x.id === s.id);
        assert.ok(sharedRow, JSON.stringify(sharedGroup.sessions.map((x) => x.id)));
        const sharedItem = api.sessions.getTreeItem({ kind: 'session', s: sharedRow });
        assert.match(String(sharedItem.description), /^(● )?alice · drive · /);
        assert.equal(sharedItem.contextValue, 'sharedSession', 'bob is offered to share or delete it');
        await assert.rejects(api.sessions.share(s.id, 'carol', 'watch'), /owner/);
        await shot('shared-with-me', 'Shared with me');
        await vscode.commands.executeCommand('fwai.setToken', process.env.E2E_TLS_TOKEN);
        await until(
          async () => (await sessionsSay()) === '' && api.connection.state === 'connected',
          () => `connected as alice again, is ${api.connection.state} ${api.connection.detail}`,
        );
        await api.sessions.unshare(s.id, 'bob');
        assert.doesNotMatch(
          String(
            api.sessions.getTreeItem({ kind: 'session', s: api.sessions.sessions.find((x) => x.id === s.id) })
              .description,
          ),
          /shared with/,
        );
        assert.ok(!asBob('--json', 'sessions', 'ls', '--shared-with-me').includes(s.id), 'still shared with bob');
        // Another token, a board leased with it, then the token revoked by an
        // admin: the lease ends with it, the views drop their lists and say
        // so with the command that fixes it, the status is in error.
        step = 'A token revoked while in use: its lease ends, the views say';
        metrics.tlsSteps.push([Date.now() - t0, step]);
        const doomed = JSON.parse(process.env.E2E_TLS_TOKEN_TO_REVOKE);
        await vscode.commands.executeCommand('fwai.setToken', doomed.token);
        await until(
          async () => (await sessionsSay()) === '' && api.connection.state === 'connected',
          () => `connected with the other token, is ${api.connection.state} ${api.connection.detail}`,
        );
        await api.boards.refresh();
        const board = api.boards.devices.find((d) => d.id === 'sim-stm32vl');
        assert.ok(board, 'no board listed over TLS');
        if (!api.boards.heldByMe(board.id)) await api.boards.lease(board);
        assert.ok(api.boards.heldByMe(board.id));
        const [bin, ...args] = JSON.parse(process.env.E2E_REVOKE);
        const said = require('child_process').execFileSync(bin, [...args, doomed.id], { encoding: 'utf8' });
        assert.match(said, /its lease .* on sim-stm32vl .*ended/);
        const revoked = await until(
          async () => ((await sessionsSay()).includes('revoked') ? await sessionsSay() : ''),
          'the Sessions view to say the token was revoked',
        );
        assert.match(revoked, /run "fwai: Set Daemon Token"/);
        await until(
          () => api.connection.state === 'error',
          () => `state error, is ${api.connection.state}`,
        );
        await api.boards.refresh();
        assert.deepEqual(
          api.boards.getChildren().map((d) => d.id),
          [],
          'boards still listed after the token was revoked',
        );
        assert.match(api.boards.message, /revoked/);
        await api.evidence.refresh();
        assert.deepEqual(api.evidence.runs, [], 'records still listed after the token was revoked');
        assert.match(api.evidence.message, /revoked/);
        await shot('connection-revoked-token', 'with a valid token');
      } catch (e) {
        throw new Error(`at step "${step}": ${(e && e.stack) || e}`);
      } finally {
        await cfg().update('daemon', home, G);
        await cfg().update('caFile', undefined, G);
        await vscode.commands.executeCommand('fwai.clearToken');
        await until(
          () =>
            api.connection.get().then(
              () => api.connection.state === 'connected',
              () => false,
            ),
          'back on the unix daemon',
        );
      }
    },
  ],
];

// The runner waits for the file to appear: it appears whole (written beside it,
// then renamed), never half-written.
function writeResults(out, report) {
  const partial = `${out}.partial`;
  fs.writeFileSync(partial, JSON.stringify(report, null, 2));
  fs.renameSync(partial, out);
}

async function run() {
  const out = process.env.E2E_RESULTS_FILE;
  // The workbench reads a remote workspace file once the remote file system
  // is up; when that read is lost, the window opens with no folders and none
  // ever arrive. That window is no test of the extension: the runner opens a
  // new one.
  let step = 'start';
  try {
    await until(() => (vscode.workspace.workspaceFolders ?? []).length >= 2, 'folders', 30000);
  } catch {
    const why = `the workspace's folders did not open (workspace file ${vscode.workspace.workspaceFile}, folders ${JSON.stringify((vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.toString()))})`;
    if (out) writeResults(out, { vscode: vscode.version, retry: why, results: [] });
    return;
  }
  const results = [];
  for (const [name, fn] of tests) {
    const t0 = Date.now();
    try {
      await fn();
      results.push({ name, ok: true, ms: Date.now() - t0 });
    } catch (e) {
      results.push({ name, ok: false, ms: Date.now() - t0, error: String((e && e.stack) || e) });
    }
  }
  if (out) writeResults(out, { vscode: vscode.version, appName: vscode.env.appName, results, metrics });
  const failed = results.filter((r) => !r.ok).length;
  if (failed) throw new Error(`${failed} extension-host test(s) failed`);
}

module.exports = { run };
