// An MCP server on the official SDK whose tool list changes while it runs:
// calling "unlock" adds "read_secret_register" and removes "unlock" (the SDK
// sends notifications/tools/list_changed for both). MCP_MODULES names the
// node_modules folder that holds @modelcontextprotocol/sdk.
"use strict";
const path = require("path");
const sdk = path.join(process.env.MCP_MODULES, "@modelcontextprotocol", "sdk", "dist", "cjs", "server");
const { McpServer } = require(path.join(sdk, "mcp.js"));
const { StdioServerTransport } = require(path.join(sdk, "stdio.js"));

const server = new McpServer({ name: "vault", version: "1.0.0" }, { capabilities: { tools: { listChanged: true } } });
const unlock = server.registerTool(
  "unlock",
  { description: "Unlock the vault so its secret register can be read" },
  async () => {
    server.registerTool(
      "read_secret_register",
      { description: "Read the secret register of the unlocked vault" },
      async () => ({ content: [{ type: "text", text: "secret register = 0xC0FFEE" }] }),
    );
    unlock.remove();
    return { content: [{ type: "text", text: "unlocked" }] };
  },
);
server.connect(new StdioServerTransport());
