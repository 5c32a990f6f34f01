// A planex executor pool in TypeScript's runtime: pool "tsdemo" with
//
//   tsdemo.greet  read:  {"name": "Ada"} → {"greeting": "Hello, Ada!"}
//   tsdemo.note   write, not idempotent: appends a note to a file, once
//                 per attempt however often the step is delivered
//   tsdemo.repeat read:  {"text": "ab", "times": 3} → {"text": "ababab"}
//                 (a large output goes through the pool's object store)
//
// Against `planex dev --pool-identity tsdemo`:
//
//   npm install
//   node main.js --dev-data-dir ~/.cache/planex/dev
//
// or with every setting explicit (flags, or the environment variables in
// brackets):
//
//   node main.js --nats-url nats://127.0.0.1:4222 [PLANEX_NATS_URL] \
//     --nkey-file executor-tsdemo.nk [PLANEX_NATS_NKEY_FILE] \
//     --verify-keys step-verify/ [PLANEX_STEP_VERIFY_KEYS] \
//     --notes-file notes.jsonl [TSDEMO_NOTES_FILE]
//
// SIGTERM or Ctrl-C stops it gracefully.
import { appendFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { ToolError, defineTool, serve } from "@planex/client/executor";

const { values: flags } = parseArgs({
  options: {
    "nats-url": { type: "string", default: process.env.PLANEX_NATS_URL },
    "nkey-file": { type: "string", default: process.env.PLANEX_NATS_NKEY_FILE },
    "creds-file": { type: "string", default: process.env.PLANEX_NATS_CREDS_FILE },
    "verify-keys": { type: "string", default: process.env.PLANEX_STEP_VERIFY_KEYS },
    "allow-unsigned-steps": { type: "boolean", default: process.env.PLANEX_ALLOW_UNSIGNED_STEPS === "1" },
    "dev-data-dir": { type: "string", default: process.env.PLANEX_DEV_DATA_DIR },
    "notes-file": { type: "string", default: process.env.TSDEMO_NOTES_FILE ?? "notes.jsonl" },
  },
});

// A planex dev data directory holds the pool's nkey seed (created by
// --pool-identity tsdemo) and the trusted step keys.
const dev = flags["dev-data-dir"];
const nkeySeedFile = flags["nkey-file"] ?? (dev ? join(dev, "credentials", "nats", "executor-tsdemo.nk") : undefined);
const verifyKeys = flags["verify-keys"] ?? (dev ? join(dev, "credentials", "step-verify") : undefined);
const notesFile = flags["notes-file"];

const greet = defineTool({
  name: "tsdemo.greet",
  description: "Greets someone by name. Returns {greeting}.",
  sideEffect: "read",
  idempotent: true,
  version: "1",
  argsSchema: {
    type: "object",
    properties: { name: { type: "string", minLength: 1, maxLength: 100, description: "who to greet" } },
    required: ["name"],
    additionalProperties: false,
  },
  outputSchema: { type: "object", properties: { greeting: { type: "string" } }, required: ["greeting"] },
  run: ({ name }) => ({ greeting: `Hello, ${name}!` }),
});

const note = defineTool({
  name: "tsdemo.note",
  description: "Writes a note to the pool's notes file. Returns {written, at}.",
  sideEffect: "write",
  idempotent: false,
  version: "1",
  sensitiveFields: ["text"],
  argsSchema: {
    type: "object",
    properties: { text: { type: "string", minLength: 1, maxLength: 2000, description: "the note" } },
    required: ["text"],
    additionalProperties: false,
  },
  outputSchema: { type: "object", properties: { written: { type: "boolean" }, at: { type: "string" } } },
  run: ({ text }, ctx) => {
    const at = new Date().toISOString();
    try {
      appendFileSync(notesFile, JSON.stringify({ at, run_id: ctx.runId, step_id: ctx.stepId, attempt: ctx.attempt, text }) + "\n");
    } catch (err) {
      throw ToolError.failed(`cannot write the notes file: ${err.code ?? "error"}`);
    }
    return { written: true, at };
  },
});

const repeat = defineTool({
  name: "tsdemo.repeat",
  description: "Repeats a text. Returns {text}; a long one (over 64 KiB) travels through the pool's object store.",
  sideEffect: "read",
  idempotent: true,
  version: "1",
  argsSchema: {
    type: "object",
    properties: {
      text: { type: "string", minLength: 1, maxLength: 100 },
      times: { type: "integer", minimum: 1, maximum: 100000, description: "how often (default 1)" },
    },
    required: ["text"],
    additionalProperties: false,
  },
  outputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  run: ({ text, times }) => ({ text: String(text).repeat(typeof times === "number" ? times : 1) }),
});

try {
  await serve({
    pool: "tsdemo",
    tools: [greet, note, repeat],
    nats: {
      servers: flags["nats-url"] ?? "nats://127.0.0.1:4222",
      nkeySeedFile,
      credsFile: flags["creds-file"],
    },
    verifyKeys,
    allowUnsignedSteps: flags["allow-unsigned-steps"],
  });
} catch (err) {
  console.error(`tsdemo: ${err.message}`);
  process.exit(1);
}
