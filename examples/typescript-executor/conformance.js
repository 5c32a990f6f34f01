// The executor under test of the conformance suite (test/conformance):
// pool "conf" with conf.echo, conf.write and conf.slow, served by the
// TypeScript SDK and configured by the CONFORMANCE_* environment as
// test/conformance/README.md describes. Every execution is recorded in
// CONFORMANCE_RECORD_FILE (one append per line) before the tool acts.
//
//   go test -count=1 -run TestConformance/typescript ./test/conformance/
import { randomBytes } from "node:crypto";
import { appendFileSync } from "node:fs";

// Imported dynamically to say what to do when the SDK is not built yet.
let sdk;
try {
  sdk = await import("@planex/client/executor");
} catch (err) {
  console.error(`conformance.js: cannot load @planex/client/executor (${err.code ?? err.message}): ` +
    "build the SDK and link this example first: clients/typescript/test.sh, or " +
    "(cd clients/typescript && npm ci && npx tsc) && (cd examples/typescript-executor && npm ci)");
  process.exit(1);
}
const { ToolError, jsonLogger, newReplicaId, serve } = sdk;

/** @param {string} name */
function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name}: required`);
  return v;
}

/** @param {string} name */
function ms(name) {
  const v = env(name);
  const n = Number(v);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`${name} ${JSON.stringify(v)}: want a positive number of milliseconds`);
  return n;
}

const pool = env("CONFORMANCE_POOL");
if (pool !== "conf") throw new Error(`CONFORMANCE_POOL ${JSON.stringify(pool)}: this executor serves pool "conf"`);
const recordFile = env("CONFORMANCE_RECORD_FILE");
const replicaId = newReplicaId();

/**
 * record appends the line of one execution and returns its id.
 * @param {string} tool
 * @param {import("@planex/client/executor").ToolContext} ctx
 */
function record(tool, ctx) {
  const id = randomBytes(8).toString("hex");
  const line = JSON.stringify({ tool, run_id: ctx.runId, step_id: ctx.stepId, attempt: ctx.attempt, executor_id: replicaId, execution_id: id });
  appendFileSync(recordFile, line + "\n"); // O_APPEND, one write
  return id;
}

/**
 * sleep waits ms or until the step is cancelled (then it fails).
 * @param {number} ms
 * @param {AbortSignal} signal
 */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      reject(signal.reason ?? ToolError.failed("cancelled"));
    }, { once: true });
  });
}

await serve({
  pool,
  replicaId,
  nats: { servers: env("CONFORMANCE_NATS_URL") },
  verifyKeys: env("CONFORMANCE_VERIFY_KEYS"),
  ackWaitMs: ms("CONFORMANCE_ACK_WAIT_MS"),
  maxDeliver: ms("CONFORMANCE_MAX_DELIVER"),
  graceMs: ms("CONFORMANCE_GRACE_MS"),
  logger: jsonLogger("info", { executor: "typescript" }),
  tools: [
    {
      name: "conf.echo",
      description: "Echoes its text.",
      sideEffect: "read",
      idempotent: true,
      argsSchema: { type: "object", properties: { text: { type: "string", maxLength: 1000 } }, required: ["text"], additionalProperties: false },
      outputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
      run: (args, ctx) => {
        record("conf.echo", ctx);
        return { text: args.text };
      },
    },
    {
      name: "conf.write",
      description: "Writes a value (a side effect that must happen once).",
      sideEffect: "write",
      idempotent: false,
      requiresApproval: true,
      argsSchema: {
        type: "object",
        properties: {
          key: { type: "string", pattern: "^[a-z0-9_-]{1,64}$" },
          value: { type: "string" },
          sleep_ms: { type: "integer", minimum: 0, maximum: 60000 },
        },
        required: ["key", "value"],
        additionalProperties: false,
      },
      outputSchema: {
        type: "object",
        properties: { key: { type: "string" }, value: { type: "string" }, execution_id: { type: "string" } },
        required: ["key", "value", "execution_id"],
      },
      run: async (args, ctx) => {
        const id = record("conf.write", ctx);
        const wait = typeof args.sleep_ms === "number" ? args.sleep_ms : 0;
        if (wait > 0) await sleep(wait, ctx.signal);
        return { key: args.key, value: args.value, execution_id: id };
      },
    },
    {
      name: "conf.slow",
      description: "Sleeps ms milliseconds.",
      sideEffect: "read",
      idempotent: true,
      argsSchema: { type: "object", properties: { ms: { type: "integer", minimum: 1, maximum: 60000 } }, required: ["ms"], additionalProperties: false },
      outputSchema: { type: "object", properties: { slept_ms: { type: "integer" } }, required: ["slept_ms"] },
      run: async (args, ctx) => {
        record("conf.slow", ctx);
        await sleep(Number(args.ms), ctx.signal);
        return { slept_ms: args.ms };
      },
    },
  ],
});
