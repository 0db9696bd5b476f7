// An MCP server that breaks the protocol in one way, chosen by FAULT:
//   method-number      answers tools/list after a notification whose method is a number
//   error-string       answers tools/call with an error that is a bare string
//   result-not-object  answers initialize with a result that is a number
//   tools-bad-fields   lists tools whose fields have the wrong types
//   call-result-string answers tools/call with a result that is a string
// Otherwise it answers correctly: one tool, "echo". Over stdio, or over
// streamable HTTP on 127.0.0.1:$PORT/mcp when PORT is set.
"use strict";
const fault = process.env.FAULT || "";

// The messages to send for one request (the last is its answer).
function handle(m) {
  const answer = (result) => ({ jsonrpc: "2.0", id: m.id, result });
  if (m.method === "initialize") {
    if (fault === "result-not-object") return [answer(5)];
    return [answer({ protocolVersion: "2025-03-26", capabilities: { tools: {} }, serverInfo: { name: "malformed", version: "1" } })];
  }
  if (m.method === "tools/list") {
    if (fault === "tools-bad-fields") {
      return [answer({ tools: [{ name: "a", description: 5, inputSchema: "x" }, { name: 7 }, "junk", { name: "b" }] })];
    }
    const list = answer({ tools: [{ name: "echo", description: "Echoes", inputSchema: { type: "object" } }] });
    if (fault === "method-number") return [{ jsonrpc: "2.0", method: 5 }, list];
    return [list];
  }
  if (m.method === "tools/call") {
    if (fault === "error-string") return [{ jsonrpc: "2.0", id: m.id, error: "boom" }];
    if (fault === "call-result-string") return [answer("x")];
    return [answer({ content: [{ type: "text", text: "echo" }] })];
  }
  return [];  // notifications
}

if (process.env.PORT) {
  require("http")
    .createServer((req, res) => {
      if (req.method !== "POST") {
        res.writeHead(req.method === "GET" ? 405 : 200).end();
        return;
      }
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        const out = handle(JSON.parse(body));
        if (out.length === 0) {
          res.writeHead(202).end();
        } else {
          res.writeHead(200, { "Content-Type": "text/event-stream" });
          res.end(out.map((m) => `event: message\ndata: ${JSON.stringify(m)}\n\n`).join(""));
        }
      });
    })
    .listen(Number(process.env.PORT), "127.0.0.1");
} else {
  require("readline")
    .createInterface({ input: process.stdin })
    .on("line", (l) => {
      for (const m of handle(JSON.parse(l))) process.stdout.write(JSON.stringify(m) + "\n");
    });
}
