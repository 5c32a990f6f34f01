// The TypeScript executor SDK in a real `planex dev`: the example pool
// (examples/typescript-executor, pool tsdemo) joins the stack's NATS with
// its own identity, its tools appear in `planex tools`, a planned run calls
// them, and step requests published by someone else — forged, replayed —
// are refused.
import assert from "node:assert/strict";
import { createPrivateKey, createPublicKey, generateKeyPairSync, sign, type KeyObject } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { create, toBinary, toJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { connect, headers, nkeyAuthenticator, type NatsConnection } from "nats";

import { RunStatus, createClient, runResult, type PlanexClient } from "../index.js";
import { Headers, StepRequestSchema, keyIdOf, signedBytes } from "../executor/index.js";
import { jsonLines, repoRoot, runPlanex, startProc, waitFor, type DevStack, type Proc } from "./harness.js";

const playbook = `
name: ts-greet
description: Greet someone with the TypeScript tsdemo pool and note it
examples:
  - TS greet Ada
match:
  - '(?i)^ts greet (?P<name>[a-z]+)$'
params:
  name: {required: true}
steps:
  - id: hello
    tool: tsdemo.greet
    args: {name: "\${{ params.name }}"}
  - id: note
    tool: tsdemo.note
    depends_on: [hello]
    args: {text: "\${{ steps.hello.output.greeting }}"}
answer: "steps.hello.output.greeting"
`;

// A large output: 100,000 bytes of text, past the 64 KiB kept inline, so
// the result refers to the pool's object store and the supervisor reads
// it from there to compute the answer.
const repeatPlaybook = `
name: ts-repeat
description: Repeat a word 20000 times with the tsdemo pool
examples:
  - TS repeat hello
match:
  - '(?i)^ts repeat (?P<word>[a-z]+)$'
params:
  word: {required: true}
steps:
  - id: rep
    tool: tsdemo.repeat
    args: {text: "\${{ params.word }}", times: 20000}
answer: "size(steps.rep.output.text)"
`;

let dev: DevStack;
let planex: PlanexClient;
let pool: Proc;
let notesFile: string;
let supervisorNats: NatsConnection;

/** playbooksDir writes the tsdemo playbook for the dev stack's --playbooks. */
export function playbooksDir(): string {
  const books = join(mkdtempSync(join(tmpdir(), "planex-ts-books-")), "playbooks");
  mkdirSync(books);
  writeFileSync(join(books, "ts-greet.yaml"), playbook);
  writeFileSync(join(books, "ts-repeat.yaml"), repeatPlaybook);
  return books;
}

function poolLog(): Record<string, unknown>[] {
  return jsonLines(pool.stderr());
}

/** publishStep publishes a StepRequest for tsdemo.greet signed by key (as keyId). */
async function publishStep(runId: string, msgID: string, key: KeyObject, keyId: string, replay?: { data: Uint8Array; h: ReturnType<typeof headers> }) {
  const subject = "planex.steps.tsdemo.greet";
  let data: Uint8Array;
  let h: ReturnType<typeof headers>;
  if (replay) {
    ({ data, h } = replay);
  } else {
    data = toBinary(StepRequestSchema, create(StepRequestSchema, { runId, stepId: "hello", attempt: 1, planRevision: 1, tool: "tsdemo.greet", args: { name: "Eve" } }));
    const expires = String(Date.now() + 60_000);
    h = headers();
    h.set("Planex-Type", "planex.v1.StepRequest");
    h.set(Headers.keyId, keyId);
    h.set(Headers.expires, expires);
    h.set(Headers.signature, sign(null, signedBytes(subject, keyId, expires, "", data), key).toString("base64"));
  }
  const js = supervisorNats.jetstream();
  await js.publish(subject, data, { msgID, headers: h });
  return { data, h };
}

/**
 * executorSuite registers the executor's tests against the dev stack
 * stack() returns, which runs with --pool-identity tsdemo and
 * --playbooks playbooksDir().
 */
export function executorSuite(stack: () => DevStack): void {
describe("TypeScript executor in planex dev", () => {
  before(async () => {
    dev = stack();
    notesFile = join(mkdtempSync(join(tmpdir(), "planex-ts-notes-")), "notes.jsonl");
    planex = createClient({ address: dev.addr, tokenFile: dev.tokenFile, tls: { caFile: dev.caFile } });
    pool = startProc(process.execPath, [
      join(repoRoot, "examples", "typescript-executor", "main.js"),
      `--dev-data-dir=${dev.dataDir}`,
      `--nats-url=${dev.natsUrl}`,
      `--notes-file=${notesFile}`,
    ]);
    // Someone else on the bus: the supervisor's own NATS identity may
    // publish step requests (the executor's may not), so the test
    // publishes with it.
    supervisorNats = await connect({
      servers: dev.natsUrl,
      authenticator: nkeyAuthenticator(new TextEncoder().encode(readFileSync(join(dev.credentialsDir, "nats", "supervisor.nk"), "utf8").trim())),
      inboxPrefix: "_INBOX_supervisor",
    });
  });

  after(async () => {
    await supervisorNats?.close();
    planex?.close();
    const code = await pool?.stop();
    if (code !== 0 && code !== undefined) console.error(`tsdemo pool exited ${code}:\n${pool.stderr().slice(-4000)}`);
  });

  it("registers its tools: planex tools lists them", async () => {
    await waitFor("tsdemo tools in `planex tools`", 60_000, () => {
      if (pool.child.exitCode !== null) throw new Error(`tsdemo pool exited ${pool.child.exitCode}:\n${pool.stderr()}`);
      const out = runPlanex(["tools", "--addr", dev.addr], dev.env);
      return out.includes("tsdemo.greet") && out.includes("tsdemo.note");
    });
    const tools = await planex.listTools("tsdemo");
    const greet = tools.find((t) => t.spec?.name === "tsdemo.greet");
    assert.ok(greet && greet.replicas.length === 1, "one replica serves tsdemo.greet");
    assert.deepEqual(greet.spec?.argsSchema?.required, ["name"]);
  });

  it("runs a plan that calls its tools", async () => {
    const { run } = await planex.startRun("TS greet Ada");
    const id = run!.id;
    for await (const ev of planex.watchRun(id, { signal: AbortSignal.timeout(120_000) })) void ev;
    const done = await planex.getRun(id);
    assert.equal(done.status, RunStatus.SUCCEEDED, `run ${id}: ${RunStatus[done.status]} ${done.stopMessage}`);
    assert.equal(toJson(ValueSchema, done.result!), "Hello, Ada!");
    const notes = readFileSync(notesFile, "utf8").trim().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(notes.map((n) => [n.run_id, n.text]), [[id, "Hello, Ada!"]], "tsdemo.note wrote once");
  });

  it("stores a large output in the pool's object store", async () => {
    const { run } = await planex.startRun("TS repeat hello");
    const id = run!.id;
    for await (const ev of planex.watchRun(id, { signal: AbortSignal.timeout(120_000) })) void ev;
    const done = await planex.getRun(id);
    assert.equal(done.status, RunStatus.SUCCEEDED, `run ${id}: ${RunStatus[done.status]} ${done.stopMessage}`);
    assert.equal(runResult(done), 100_000);
    const ref = done.steps.find((s) => s.stepId === "rep")?.outputRef;
    assert.equal(ref?.bucket, "planex-outputs-tsdemo", "the output was stored, not inlined");
  });

  it("refuses forged and replayed steps", async () => {
    const signing = createPrivateKey(readFileSync(join(dev.credentialsDir, "step-signing.key")));
    const trustedId = keyIdOf(createPublicKey(signing));
    const suffix = Date.now().toString(36).toUpperCase();

    // A correctly signed request runs once; the same bytes and headers
    // published again (a new message id, so a new stream sequence) are a
    // replay.
    const replayRun = `TSREPLAY${suffix}`;
    const first = await publishStep(replayRun, `${replayRun}:hello:1`, signing, trustedId);
    await waitFor("the signed step to run", 30_000, () => poolLog().some((l) => l.msg === "step finished" && l.run_id === replayRun));
    await publishStep(replayRun, `${replayRun}:hello:1:again`, signing, trustedId, first);
    await waitFor("the replay to be refused", 30_000, () =>
      poolLog().some((l) => l.msg === "refused step request: not executed" && l.run_id === replayRun && l.reason === "replayed"));

    // A request signed by another key under the trusted key's id.
    const forgedRun = `TSFORGED${suffix}`;
    const { privateKey: other } = generateKeyPairSync("ed25519");
    await publishStep(forgedRun, `${forgedRun}:hello:1`, other, trustedId);
    await waitFor("the forged step to be refused", 30_000, () =>
      poolLog().some((l) => l.msg === "refused step request: not executed" && l.run_id === forgedRun && l.reason === "bad_signature"));

    const ran = poolLog().filter((l) => l.msg === "step finished" && (l.run_id === replayRun || l.run_id === forgedRun));
    assert.deepEqual(ran.map((l) => l.run_id), [replayRun], "only the genuine request ran, once");
  });

  it("deregisters on SIGTERM", async () => {
    assert.equal(await pool.stop(), 0, `exit code; stderr:\n${pool.stderr().slice(-2000)}`);
    assert.ok(poolLog().some((l) => l.msg === "executor stopped"));
    // The catalog keeps a tool it knew (its floor) but without replicas.
    await waitFor("tsdemo's replica to leave the catalog", 30_000, async () => (await planex.listTools("tsdemo")).every((t) => t.replicas.length === 0));
    assert.ok(existsSync(notesFile));
  });
});
}
