// The client against a real `planex dev`: runs started and watched to
// the end, a gate decided, a dropped watch stream resumed, typed errors.
import assert from "node:assert/strict";
import { createServer, connect as tcpConnect, type Server, type Socket } from "node:net";
import { after, before, describe, it } from "node:test";

import {
  Code,
  InvalidArgument,
  NotFound,
  PlanexError,
  RunStatus,
  Unauthenticated,
  createClient,
  isTerminal,
  type PlanexClient,
  type RunEvent,
} from "../index.js";
import type { DevStack } from "./harness.js";

let dev: DevStack;
let planex: PlanexClient;

/** watch collects a run's events until the stream ends. */
async function watch(client: PlanexClient, runId: string): Promise<RunEvent[]> {
  const events: RunEvent[] = [];
  for await (const ev of client.watchRun(runId, { signal: AbortSignal.timeout(120_000) })) events.push(ev);
  return events;
}

function assertContiguous(events: RunEvent[]): void {
  assert.ok(events.length > 0, "no events");
  events.forEach((ev, i) => assert.equal(ev.sequence, BigInt(i + 1), `event ${i} has sequence ${ev.sequence}`));
  assert.equal(events.at(-1)!.payload.case, "finished", "the last event is the run's final one");
}

/** clientSuite registers the client's tests against the dev stack stack() returns. */
export function clientSuite(stack: () => DevStack): void {
describe("client against planex dev", () => {
  before(() => {
    dev = stack();
    planex = createClient({ address: dev.addr, tokenFile: dev.tokenFile, tls: { caFile: dev.caFile } });
  });
  after(() => planex?.close());

  it("lists the catalog", async () => {
    const tools = await planex.listTools();
    assert.ok(tools.some((t) => t.spec?.name === "sql.query" && t.replicas.length > 0), "sql.query is registered");
    const sql = await planex.listTools("sql");
    assert.ok(sql.length > 0 && sql.every((t) => t.spec?.pool === "sql"));
  });

  it("starts a run and watches it to the end", async () => {
    const req = { goal: "How many open support tickets does Acme Corp have?", labels: { suite: "typescript" }, idempotencyKey: "ts-client-watch-1" };
    const { run, existing } = await planex.startRun(req);
    assert.ok(run?.id);
    assert.equal(existing, false);
    const again = await planex.startRun(req);
    assert.equal(again.run?.id, run.id);
    assert.equal(again.existing, true);
    // The same key with other parameters is refused, naming the field.
    await assert.rejects(planex.startRun({ ...req, labels: {} }), (err: unknown) => err instanceof PlanexError && err.code === Code.FailedPrecondition && err.field === "idempotency_key");

    const events = await watch(planex, run.id);
    assertContiguous(events);
    assert.ok(events.some((e) => e.payload.case === "stepSucceeded"));
    const done = await planex.getRun(run.id);
    assert.equal(done.status, RunStatus.SUCCEEDED, `run ${run.id}: ${RunStatus[done.status]} ${done.stopMessage}`);
    assert.ok(isTerminal(done));

    const page = await planex.listRuns({ labels: { suite: "typescript" } });
    assert.ok(page.runs.some((r) => r.id === run.id));
    // Watching a finished run from a later sequence delivers the rest only.
    const tail: RunEvent[] = [];
    for await (const ev of planex.watchRun(run.id, { fromSequence: events.length })) tail.push(ev);
    assert.deepEqual(tail.map((e) => e.sequence), [BigInt(events.length)]);
  });

  it("decides a gate", async () => {
    const { run } = await planex.startRun("Close support ticket 400");
    const id = run!.id;
    let gateId = "";
    for await (const ev of planex.watchRun(id, { signal: AbortSignal.timeout(120_000) })) {
      if (ev.payload.case === "gateOpened") {
        gateId = ev.payload.value.gate?.id ?? "";
        break;
      }
      assert.notEqual(ev.payload.case, "finished", "the run finished without opening a gate");
    }
    assert.ok(gateId, "a gate opened");
    const open = await planex.listGates(id);
    assert.deepEqual(open.map((g) => g.gate?.id), [gateId]);
    assert.equal(open[0].tool, "sql.exec");

    const decided = await planex.decide({ runId: id, gateId, decision: "approve", actor: "ts-test", comment: "approved by the TypeScript client test" });
    assert.equal(decided.gates.find((g) => g.id === gateId)?.actor, "ts-test");
    const events = await watch(planex, id);
    assertContiguous(events);
    assert.ok(events.some((e) => e.payload.case === "gateDecided"));
    const done = await planex.getRun(id);
    assert.equal(done.status, RunStatus.SUCCEEDED, `run ${id}: ${RunStatus[done.status]} ${done.stopMessage}`);
  });

  it("resumes a watch whose connection dropped", async () => {
    // A TCP proxy in front of the supervisor, whose connections the test
    // cuts while the run waits at its gate (the stream open, idle): the
    // watch goes on through a new connection and sees the rest.
    const sockets = new Set<Socket>();
    let connections = 0;
    const proxy: Server = createServer((down) => {
      connections++;
      const up = tcpConnect(Number(dev.addr.split(":")[1]), "127.0.0.1");
      sockets.add(down).add(up);
      down.pipe(up).pipe(down);
      const close = () => {
        down.destroy();
        up.destroy();
      };
      down.on("error", close).on("close", close);
      up.on("error", close).on("close", close);
    });
    await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
    const port = (proxy.address() as { port: number }).port;
    const viaProxy = createClient({ address: `127.0.0.1:${port}`, tokenFile: dev.tokenFile, tls: { caFile: dev.caFile } });
    try {
      const { run } = await planex.startRun("Close support ticket 402");
      const id = run!.id;
      const events: RunEvent[] = [];
      for await (const ev of viaProxy.watchRun(id, { signal: AbortSignal.timeout(120_000) })) {
        events.push(ev);
        if (ev.payload.case === "gateOpened") {
          for (const s of sockets) s.destroy();
          await planex.decide({ runId: id, gateId: ev.payload.value.gate!.id, decision: "reject", stopRun: true, comment: "resume test" });
        }
      }
      assertContiguous(events);
      assert.ok(events.some((e) => e.payload.case === "gateDecided"), "the watch saw the decision made after the cut");
      assert.ok(connections >= 2, `the watch reconnected (${connections} connections)`);
      assert.equal((await planex.getRun(id)).status, RunStatus.FAILED);
    } finally {
      viaProxy.close();
      for (const s of sockets) s.destroy();
      proxy.close();
    }
  });

  it("throws typed errors", async () => {
    const bad = createClient({ address: dev.addr, token: "pxk_not-a-key", tls: { caFile: dev.caFile } });
    try {
      await assert.rejects(bad.listTools(), (err: unknown) => err instanceof Unauthenticated && err.code === Code.Unauthenticated);
    } finally {
      bad.close();
    }
    await assert.rejects(planex.getRun("01JUNKNOWNRUN00000000000000"), (err: unknown) => {
      assert.ok(err instanceof NotFound, String(err));
      assert.ok(err instanceof PlanexError);
      assert.equal(err.codeName, "NotFound");
      return true;
    });
    await assert.rejects(planex.startRun({ goal: "" }), (err: unknown) => {
      assert.ok(err instanceof InvalidArgument, String(err));
      assert.equal(err.field, "goal");
      return true;
    });
    await assert.rejects(planex.getRun("not a run"), (err: unknown) => err instanceof InvalidArgument && err.field === "run_id");
    const events = planex.watchRun("01JUNKNOWNRUN00000000000000");
    await assert.rejects(events.next(), (err: unknown) => err instanceof NotFound);
  });

  it("rejects bad options naming them", () => {
    assert.throws(() => createClient({ address: "" }), /address: required/);
    assert.throws(() => createClient({ address: "localhost" }), /address "localhost": want host:port/);
    assert.throws(() => createClient({ address: "127.0.0.1:1", tls: { certFile: dev.caFile } }), /tls.key: required with tls.cert/);
    assert.throws(() => createClient({ address: "127.0.0.1:1", tokenFile: "/nonexistent/token" }), /tokenFile \/nonexistent\/token/);
    assert.throws(() => createClient({ address: "https://127.0.0.1:1", plaintext: true }), /plaintext: conflicts/);
  });
});
}
