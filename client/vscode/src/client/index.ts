// The vscode-free client library: everything the extension knows about fwaid.
export * from './address';
export * from './autostart';
export * from './connection';
export * from './edits';
export * from './errors';
export * from './events';
export * from './firmware';
export * from './knowledge';
export * from './model';
export * from './proto';
export * from './reach';
export * from './rpc';
export * from './refs';
export * from './serial';
export * from './session';
export * from './skills';
export * from './sarif';
