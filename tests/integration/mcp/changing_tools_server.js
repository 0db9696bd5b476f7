// An MCP server on the official SDK whose tool list changes while it runs:
// calling "unlock" adds "read_secret_register" and removes "unlock" (the SDK
// sends notifications/tools/list_changed for both). MCP_MODULES names the
// node_modules folder that holds @modelcontextprotocol/sdk. Over stdio, or
// over streamable HTTP on 127.0.0.1:$PORT/mcp when PORT is set.
"use strict";
const path = require("path");
const sdk = path.join(process.env.MCP_MODULES, "@modelcontextprotocol", "sdk", "dist", "cjs", "server");
const { McpServer } = require(path.join(sdk, "mcp.js"));

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

if (process.env.PORT) {
  const http = require("http");
  const { randomUUID } = require("crypto");
  const { StreamableHTTPServerTransport } = require(path.join(sdk, "streamableHttp.js"));
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID() });
  server.connect(transport).then(() => {
    http
      .createServer((req, res) => {
        let body = "";
        req.on("data", (c) => (body += c));
        req.on("end", () => transport.handleRequest(req, res, body ? JSON.parse(body) : undefined));
      })
      .listen(Number(process.env.PORT), "127.0.0.1");
  });
} else {
  const { StdioServerTransport } = require(path.join(sdk, "stdio.js"));
  server.connect(new StdioServerTransport());
}
