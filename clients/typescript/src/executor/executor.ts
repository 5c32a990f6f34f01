import { createHash, randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { readFileSync } from "node:fs";

import { create, fromBinary, fromJson, toBinary, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema, durationFromMs, durationMs, timestampFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  StorageType,
  Match,
  connect,
  credsAuthenticator,
  headers as natsHeaders,
  nanos,
  nkeyAuthenticator,
  tokenAuthenticator,
  usernamePasswordAuthenticator,
  type ConnectionOptions,
  type ConsumerConfig,
  type ConsumerMessages,
  type JetStreamClient,
  type JsMsg,
  type MsgHdrs,
  type NatsConnection,
  type Subscription,
} from "nats";
import type { ValidateFunction } from "ajv/dist/2020.js";

import {
  StepRequestSchema,
  StepResultSchema,
  StepResultStatus,
  StepStartedNoticeSchema,
  type StepRequest,
  type StepResult,
} from "../gen/planex/v1/executor_pb.js";
import { ErrorCode, SideEffect, ToolSpecSchema, type ToolSpec } from "../gen/planex/v1/plan_pb.js";
import { Bucket, KeyExists, isWrongLastSequence } from "./kv.js";
import { OutputStore } from "./objects.js";
import { jsonLogger, type Logger } from "./log.js";
import { checkArgs, compileArgsSchema } from "./schema.js";
import { ToolError, type ToolContext, type ToolDefinition } from "./tool.js";
import { ReplayCacheUnavailable, StepRefused, StepVerifier, type SharedReplays } from "./verify.js";

/** Names of the protocol (docs/executor-protocol.md). */
export const Names = {
  streamSteps: "PLANEX_STEPS",
  bucketTools: "planex-tools",
  bucketEffects: "planex-effects",
  bucketReplay: "planex-step-replay",
  stepsPrefix: "planex.steps.",
  enginePrefix: "planex.engine.",
  headerType: "Planex-Type",
} as const;

/** Defaults of {@link ExecutorOptions} fields left unset (those of the Go runner). */
export const Defaults = {
  concurrency: 4,
  ackWaitMs: 5000,
  maxDeliver: 5,
  maxOutputBytes: 4 << 20,
  inlineOutputBytes: 64 << 10,
  defaultTimeoutMs: 60_000,
  maxArgsBytes: 256 << 10,
  callTimeoutMs: 2000,
  recordGraceMs: 15_000,
  startedNoticeDelayMs: 20,
  shutdownGraceMs: 30_000,
} as const;

const tokenRE = /^[A-Za-z0-9_-]{1,128}$/;
const toolRE = /^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$/;

/** How the executor reaches NATS: servers and one way to authenticate, plus TLS. */
export interface NatsOptions {
  /** Server URL(s), "nats://127.0.0.1:4222". */
  servers: string | string[];
  /** File holding an nkey seed (planex dev: <data-dir>/credentials/nats/executor-<pool>.nk). */
  nkeySeedFile?: string;
  /** An nkey seed ("SU…"). */
  nkeySeed?: string;
  /** A .creds file (JWT and seed). */
  credsFile?: string;
  /** A token. */
  token?: string;
  /** User and password. */
  user?: string;
  pass?: string;
  /** TLS: CA bundle, client certificate and key files. */
  tls?: { caFile?: string; certFile?: string; keyFile?: string };
}

/** Options of an {@link Executor}. */
export interface ExecutorOptions {
  /** Pool name; every tool is "<pool>.<verb>". */
  pool: string;
  /** The pool's tools. */
  tools: ToolDefinition<any>[];
  /** How to reach NATS; or connection. */
  nats?: NatsOptions;
  /** An open NATS connection to use instead of nats (the executor does not close it). */
  connection?: NatsConnection;
  /** Trusted step-signing public keys: a PKIX PEM file or a directory of them. Required unless allowUnsignedSteps. */
  verifyKeys?: string;
  /** Run steps without verifying their signature (explicit opt-out: anyone who can publish on planex.steps.* runs tools). */
  allowUnsignedSteps?: boolean;
  /** This replica's id (executor_id); "<hostname>-<random hex>" when unset. */
  replicaId?: string;
  /** Steps this replica runs at once (default 4); also the consumer's max_ack_pending. */
  concurrency?: number;
  /** The pool consumer's ack_wait (default 5000 ms); in-progress acks go every quarter of it. */
  ackWaitMs?: number;
  /** The pool consumer's max_deliver (default 5). */
  maxDeliver?: number;
  /** Largest output, JSON-encoded (default 4 MiB); a larger top-level array is cut, anything else fails. */
  maxOutputBytes?: number;
  /** Largest output kept inline (default 64 KiB); larger ones go to the pool's object store. */
  inlineOutputBytes?: number;
  /** Timeout when neither the step nor the tool sets one (default 60 s). */
  defaultTimeoutMs?: number;
  /** How long a step runs before its started notice and heartbeats are sent (default 20 ms). */
  startedNoticeDelayMs?: number;
  /** Bound of one JetStream call (default 2000 ms). */
  callTimeoutMs?: number;
  /** Least time spent recording and reporting a side effect that happened (default 15 s). */
  recordGraceMs?: number;
  /** Receives the logs (default: JSON lines on stderr, info and up). */
  logger?: Logger;
}

/** StepOutcome is what {@link Executor.onStep} observers see of each finished attempt. */
export interface StepOutcome {
  tool: string;
  runId: string;
  stepId: string;
  attempt: number;
  status: "succeeded" | "failed" | "outcome_unknown" | "replayed" | "refused" | "retried" | "poison";
  reason?: string;
}

interface Tool {
  def: ToolDefinition<any>;
  spec: ToolSpec;
  validate?: ValidateFunction;
  effectful: boolean;
}

/** The attempt was given back because the executor stopped (not a result). */
class GivenBack extends Error {}

/**
 * Executor runs one replica of an executor pool: it registers the pool's
 * tools in planex-tools, consumes the pool's durable consumer on
 * PLANEX_STEPS, verifies each step request's signature, runs the tool
 * with the protocol's validation, idempotency records, started notices,
 * heartbeats and in-progress acks, and publishes each attempt's
 * StepResult before acknowledging the step (docs/executor-protocol.md).
 */
export class Executor {
  /** This replica's id. */
  readonly replicaId: string;
  /** Pool name. */
  readonly pool: string;
  /** Called after each delivery is handled (tests, metrics). */
  onStep?: (o: StepOutcome) => void;

  private readonly o: Required<Omit<ExecutorOptions, "nats" | "connection" | "verifyKeys" | "allowUnsignedSteps" | "tools" | "replicaId">>;
  private readonly tools = new Map<string, Tool>();
  private readonly log: Logger;
  private readonly verifier?: StepVerifier;
  private readonly natsOpts?: NatsOptions;
  private nc?: NatsConnection;
  private ownConn = false;
  private js!: JetStreamClient;
  private toolsKV!: Bucket;
  private effects!: Bucket;
  private outputs?: Promise<OutputStore>;
  private attemptsSub?: Subscription;
  private regTimer?: NodeJS.Timeout;
  private fetching?: ConsumerMessages;
  private loopDone?: Promise<void>;
  private stopping = false;
  private started = false;
  private readonly inflight = new Set<Promise<void>>();
  private readonly running = new Map<string, number>();
  private readonly work = new AbortController();
  private free: number;
  private waiters: (() => void)[] = [];

  /** Checks the options; throws an Error naming the first bad one. */
  constructor(opts: ExecutorOptions) {
    if (!opts || typeof opts.pool !== "string" || !/^[a-z][a-z0-9_]*$/.test(opts.pool)) {
      throw new Error(`pool ${JSON.stringify(opts?.pool)}: want ^[a-z][a-z0-9_]*$`);
    }
    this.pool = opts.pool;
    this.replicaId = opts.replicaId ?? newReplicaId();
    if (!tokenRE.test(this.replicaId)) throw new Error(`replicaId ${JSON.stringify(this.replicaId)}: want ^[A-Za-z0-9_-]{1,128}$`);
    const positive = (name: string, v: number | undefined, def: number) => {
      if (v === undefined) return def;
      if (!Number.isFinite(v) || v <= 0) throw new Error(`${name} ${v}: want a positive number`);
      return v;
    };
    this.o = {
      pool: opts.pool,
      concurrency: Math.floor(positive("concurrency", opts.concurrency, Defaults.concurrency)),
      ackWaitMs: positive("ackWaitMs", opts.ackWaitMs, Defaults.ackWaitMs),
      maxDeliver: Math.floor(positive("maxDeliver", opts.maxDeliver, Defaults.maxDeliver)),
      maxOutputBytes: positive("maxOutputBytes", opts.maxOutputBytes, Defaults.maxOutputBytes),
      inlineOutputBytes: positive("inlineOutputBytes", opts.inlineOutputBytes, Defaults.inlineOutputBytes),
      defaultTimeoutMs: positive("defaultTimeoutMs", opts.defaultTimeoutMs, Defaults.defaultTimeoutMs),
      startedNoticeDelayMs: opts.startedNoticeDelayMs ?? Defaults.startedNoticeDelayMs,
      callTimeoutMs: positive("callTimeoutMs", opts.callTimeoutMs, Defaults.callTimeoutMs),
      recordGraceMs: positive("recordGraceMs", opts.recordGraceMs, Defaults.recordGraceMs),
      logger: opts.logger ?? jsonLogger(),
    };
    this.o.inlineOutputBytes = Math.min(this.o.inlineOutputBytes, this.o.maxOutputBytes);
    this.free = this.o.concurrency;
    this.log = this.o.logger;
    if (!Array.isArray(opts.tools) || opts.tools.length === 0) throw new Error("tools: want at least one tool");
    for (const def of opts.tools) {
      const t = this.toolOf(def);
      if (this.tools.has(t.spec.name)) throw new Error(`tool ${t.spec.name}: defined twice`);
      this.tools.set(t.spec.name, t);
    }
    if (opts.verifyKeys && opts.allowUnsignedSteps) throw new Error("allowUnsignedSteps: conflicts with verifyKeys");
    if (!opts.verifyKeys && !opts.allowUnsignedSteps) {
      throw new Error("verifyKeys: required (a public key file or directory), or allowUnsignedSteps to run steps nobody signed");
    }
    if (opts.verifyKeys) this.verifier = new StepVerifier(opts.verifyKeys);
    if (opts.connection === undefined && opts.nats === undefined) throw new Error("nats: required (servers and credentials), or connection");
    this.nc = opts.connection;
    this.natsOpts = opts.nats;
  }

  private toolOf(def: ToolDefinition<any>): Tool {
    if (!def || typeof def.name !== "string" || !toolRE.test(def.name)) {
      throw new Error(`tool name ${JSON.stringify(def?.name)}: want <pool>.<verb> in lower case`);
    }
    if (def.name.split(".")[0] !== this.pool) throw new Error(`tool ${def.name}: does not belong to pool ${this.pool}`);
    if (typeof def.run !== "function") throw new Error(`tool ${def.name}: run: required`);
    const effect = { read: SideEffect.READ, write: SideEffect.WRITE, external: SideEffect.EXTERNAL }[def.sideEffect ?? "external"];
    if (effect === undefined) throw new Error(`tool ${def.name}: sideEffect ${JSON.stringify(def.sideEffect)}: want read, write or external`);
    const spec = create(ToolSpecSchema, {
      name: def.name,
      pool: this.pool,
      description: def.description ?? "",
      argsSchema: def.argsSchema,
      outputSchema: def.outputSchema,
      sideEffect: effect,
      idempotent: def.idempotent ?? false,
      requiresApproval: def.requiresApproval ?? false,
      sensitiveFields: def.sensitiveFields ?? [],
      version: def.version ?? "",
    });
    if (def.defaultTimeoutMs) spec.defaultTimeout = durationFromMs(def.defaultTimeoutMs);
    if (def.heartbeatTimeoutMs) spec.heartbeatTimeout = durationFromMs(def.heartbeatTimeoutMs);
    return { def, spec, validate: compileArgsSchema(def.name, def.argsSchema), effectful: effect !== SideEffect.READ };
  }

  /** specs returns the pool's tool specs, sorted by name. */
  specs(): ToolSpec[] {
    return [...this.tools.values()].map((t) => t.spec).sort((a, b) => a.name.localeCompare(b.name));
  }

  /**
   * start connects (unless given a connection), binds planex's buckets,
   * creates or updates the pool's consumer, registers the tools and starts
   * consuming. It throws when any of that fails.
   */
  async start(): Promise<void> {
    if (this.started) throw new Error("executor already started");
    this.started = true;
    if (this.nc === undefined) {
      const servers = this.natsOpts!.servers;
      try {
        this.nc = await connect(await connectionOptions(this.natsOpts!, this.pool));
      } catch (err) {
        throw new Error(`connect to NATS at ${String(servers)}: ${(err as Error).message}`, { cause: err });
      }
      this.ownConn = true;
    }
    try {
      await this.bind(this.nc);
    } catch (err) {
      clearInterval(this.regTimer);
      if (this.ownConn) await this.nc.close().catch(() => {});
      throw err;
    }
  }

  private async bind(nc: NatsConnection): Promise<void> {
    this.js = nc.jetstream({ timeout: this.o.callTimeoutMs });
    const jsm = await nc.jetstreamManager({ timeout: this.o.callTimeoutMs });
    // The supervisor creates the streams and buckets; an executor binds.
    const toolsInfo = await jsm.streams.info(`KV_${Names.bucketTools}`);
    await jsm.streams.info(`KV_${Names.bucketEffects}`);
    this.toolsKV = new Bucket(nc, this.js, Names.bucketTools, this.o.callTimeoutMs);
    this.effects = new Bucket(nc, this.js, Names.bucketEffects, this.o.callTimeoutMs);
    if (this.verifier) {
      try {
        await jsm.streams.info(`KV_${Names.bucketReplay}`);
      } catch {
        // Missing: created as the Go executors do (entries live as long as a signature may).
        await this.js.views.kv(Names.bucketReplay, {
          history: 1,
          ttl: 48 * 3600 * 1000,
          max_bytes: 64 << 20,
          description: "planex: step request signatures already accepted by an executor replica (replay protection)",
        });
      }
      this.verifier.shareReplays(new KvSharedReplays(new Bucket(nc, this.js, Names.bucketReplay, this.o.callTimeoutMs), this.pool));
    }
    const durable = `pool-${this.pool}`;
    // Create or update (action ""), as every replica of the pool does at
    // start; nats.js types only the create action.
    const addConsumer = jsm.consumers.add.bind(jsm.consumers) as (s: string, c: Partial<ConsumerConfig>, action: string) => Promise<unknown>;
    await addConsumer(
      Names.streamSteps,
      {
        durable_name: durable,
        description: `planex executor pool ${this.pool}`,
        filter_subject: `${Names.stepsPrefix}${this.pool}.>`,
        ack_policy: AckPolicy.Explicit,
        ack_wait: nanos(this.o.ackWaitMs),
        max_deliver: this.o.maxDeliver,
        max_ack_pending: this.o.concurrency,
        deliver_policy: DeliverPolicy.All,
      },
      "",
    );
    const consumer = await this.js.consumers.get(Names.streamSteps, durable);
    this.attemptsSub = nc.subscribe(`planex.executor.${this.pool}.${this.replicaId}.attempts`, {
      callback: (err, m) => {
        if (err) return;
        m.respond(new TextEncoder().encode((this.running.get(new TextDecoder().decode(m.data)) ?? 0) > 0 ? "running" : "idle"));
      },
    });
    const ttlMs = Number(toolsInfo.config.max_age ?? 0) / 1e6;
    const interval = ttlMs > 0 ? Math.max(ttlMs / 3, 50) : 10_000;
    await this.register();
    this.regTimer = setInterval(() => {
      this.register().catch((err) => {
        if (!this.stopping) this.log.warn("renew tool registrations", { err });
      });
    }, interval);
    this.loopDone = this.fetchLoop(consumer);
    this.log.info("executor consuming", {
      pool: this.pool, executor_id: this.replicaId, consumer: durable, concurrency: this.o.concurrency,
      ack_wait_ms: this.o.ackWaitMs, max_deliver: this.o.maxDeliver, tools: this.tools.size,
    });
  }

  /**
   * stop stops fetching, lets running steps finish within graceMs (then
   * cancels them: they are given back to the pool), removes the replica's
   * registrations and drains the connection it opened.
   */
  async stop(graceMs: number = Defaults.shutdownGraceMs): Promise<void> {
    if (!this.started || this.stopping) return;
    this.stopping = true;
    this.fetching?.stop();
    for (const w of this.waiters.splice(0)) w();
    await this.loopDone;
    const all = Promise.allSettled([...this.inflight]);
    if (!(await within(all, graceMs))) {
      this.log.warn("grace period over, cancelling running steps", { running: this.inflight.size });
      this.work.abort(new GivenBack("executor stopping"));
      await within(Promise.allSettled([...this.inflight]), 2000);
    }
    clearInterval(this.regTimer);
    const errs: unknown[] = [];
    for (const spec of this.specs()) {
      try {
        await this.toolsKV.delete(`${spec.name}.${this.replicaId}`);
      } catch (err) {
        errs.push(new Error(`deregister tool ${spec.name}: ${(err as Error).message}`));
      }
    }
    this.attemptsSub?.unsubscribe();
    if (this.ownConn && this.nc) {
      try {
        await this.nc.drain();
      } catch (err) {
        errs.push(new Error(`drain NATS connection: ${(err as Error).message}`));
      }
    }
    this.log.info("executor stopped", { pool: this.pool, executor_id: this.replicaId });
    if (errs.length > 0) throw new AggregateError(errs, "stop executor");
  }

  private async register(): Promise<void> {
    if (this.stopping) return;
    for (const spec of this.specs()) {
      await this.toolsKV.put(`${spec.name}.${this.replicaId}`, toBinary(ToolSpecSchema, spec));
    }
  }

  // --- fetching ---------------------------------------------------------

  private async acquire(): Promise<boolean> {
    while (this.free === 0 && !this.stopping) await new Promise<void>((r) => this.waiters.push(r));
    if (this.stopping) return false;
    this.free--;
    return true;
  }

  private release(n = 1): void {
    this.free += n;
    for (const w of this.waiters.splice(0)) w();
  }

  private async fetchLoop(consumer: Awaited<ReturnType<JetStreamClient["consumers"]["get"]>>): Promise<void> {
    let backoff = 100;
    while (!this.stopping) {
      if (!(await this.acquire())) return;
      let n = 1;
      while (this.free > 0 && n < this.o.concurrency) {
        this.free--;
        n++;
      }
      let got = 0;
      try {
        this.fetching = await consumer.fetch({ max_messages: n, expires: 5000 });
        if (this.stopping) this.fetching.stop();
        for await (const m of this.fetching) {
          got++;
          const p = this.handle(m).finally(() => {
            this.inflight.delete(p);
            this.release();
          });
          this.inflight.add(p);
        }
        backoff = 100;
      } catch (err) {
        if (this.stopping) break;
        this.log.warn("fetch steps", { err, retry_in_ms: backoff });
        await sleep(backoff);
        backoff = Math.min(2 * backoff, 5000);
      } finally {
        this.release(n - got);
      }
    }
  }

  // --- one delivery -----------------------------------------------------

  private async handle(m: JsMsg): Promise<void> {
    let req: StepRequest;
    try {
      req = fromBinary(StepRequestSchema, m.data);
      checkRequest(req);
    } catch (err) {
      this.log.error("terminating undecodable step request", { subject: m.subject, err });
      m.term();
      this.observe({ tool: "", runId: "", stepId: "", attempt: 0, status: "poison", reason: (err as Error).message });
      return;
    }
    const delivered = m.info.redeliveryCount;
    const tool = this.tools.get(req.tool);
    const attrs = { run_id: req.runId, step_id: req.stepId, attempt: req.attempt, tool: req.tool, delivered };
    if (this.verifier) {
      try {
        await this.verifier.verify({
          subject: m.subject,
          header: (n) => header(m.headers, n),
          data: m.data,
          streamSeq: m.seq,
          tool: req.tool,
          requiresApproval: tool === undefined || tool.def.requiresApproval === true,
        });
      } catch (err) {
        if (err instanceof ReplayCacheUnavailable) {
          this.log.warn("step request not executed yet: the shared replay cache is unreachable", { ...attrs, err });
          m.nak(nakDelay(delivered));
          return;
        }
        const reason = err instanceof StepRefused ? err.reason : "bad_signature";
        this.log.warn("refused step request: not executed", { ...attrs, reason, subject: m.subject, stream_seq: m.seq, err });
        m.term();
        this.observe({ tool: req.tool, runId: req.runId, stepId: req.stepId, attempt: req.attempt, status: "refused", reason });
        return;
      }
    }
    const stopWPI = keepInProgress(m, Math.max(this.o.ackWaitMs / 4, 10));
    const notice = new StartNotice(this, req, delivered, header(m.headers, "traceparent"));
    try {
      let res: StepResult;
      let retry: ToolError | undefined;
      try {
        ({ res, retry } = await this.execute(req, tool, notice, header(m.headers, "traceparent")));
      } catch (err) {
        if (err instanceof GivenBack) {
          this.log.warn("step given back: the executor is stopping", attrs);
          stopWPI();
          m.nak();
          return;
        }
        this.log.error("run step", { ...attrs, err });
        retry = ToolError.unavailable("executor could not reach JetStream", err);
        res = this.failure(req, Date.now(), retry);
      }
      notice.cancel();
      if (retry !== undefined) {
        if (delivered < this.o.maxDeliver) {
          const delay = nakDelay(delivered);
          this.log.warn("step will be retried", { ...attrs, retry_in_ms: delay, err: retry.message });
          notice.stop();
          stopWPI();
          m.nak(delay);
          this.observe({ tool: req.tool, runId: req.runId, stepId: req.stepId, attempt: req.attempt, status: "retried" });
          return;
        }
        res.status = StepResultStatus.FAILED;
        res.error = { $typeName: "planex.v1.StepError", code: retry.code, message: `gave up after ${delivered} deliveries: ${retry.message}`, field: retry.field ?? "", retryable: true };
      }
      try {
        await this.publishResult(req, res, header(m.headers, "traceparent"));
      } catch (err) {
        this.log.error("publish step result; the step will be redelivered", { ...attrs, err });
        notice.stop();
        stopWPI();
        m.nak(nakDelay(delivered));
        return;
      }
      notice.stop();
      stopWPI();
      m.ack();
      const status = res.replayed ? "replayed" : res.status === StepResultStatus.SUCCEEDED ? "succeeded" : res.status === StepResultStatus.OUTCOME_UNKNOWN ? "outcome_unknown" : "failed";
      this.log.info("step finished", { ...attrs, status, duration_ms: res.duration ? durationMs(res.duration) : 0, error_code: res.error ? ErrorCode[res.error.code] : undefined, error: res.error?.message });
      this.observe({ tool: req.tool, runId: req.runId, stepId: req.stepId, attempt: req.attempt, status, reason: res.error?.message });
    } finally {
      notice.stop();
      stopWPI();
    }
  }

  private observe(o: StepOutcome): void {
    try {
      this.onStep?.(o);
    } catch {
      // an observer's failure is not the step's
    }
  }

  /** execute runs one attempt; retry is set when the step should be redelivered. */
  private async execute(req: StepRequest, tool: Tool | undefined, notice: StartNotice, traceparent?: string): Promise<{ res: StepResult; retry?: ToolError }> {
    const start = Date.now();
    if (tool === undefined) {
      return {
        res: this.failure(req, start, new ToolError(ErrorCode.UNKNOWN_TOOL,
          `pool ${JSON.stringify(this.pool)} has no tool ${JSON.stringify(req.tool)}; it runs ${[...this.tools.keys()].sort().join(", ")}`, { field: "tool" })),
      };
    }
    const args: JsonObject = req.args ?? {};
    const size = Buffer.byteLength(JSON.stringify(args));
    if (size > Defaults.maxArgsBytes) {
      return { res: this.failure(req, start, ToolError.invalidArgument("args", `arguments of ${size} bytes exceed the ${Defaults.maxArgsBytes} byte limit`)) };
    }
    const problem = checkArgs(tool.validate, args);
    if (problem) return { res: this.failure(req, start, new ToolError(ErrorCode.INVALID_ARGUMENT, problem.message, { field: problem.field })) };

    const key = `${req.runId}.${req.stepId}.${req.attempt}`;
    const { timeoutMs, until } = this.budget(tool, req, start);
    if (tool.effectful) {
      const earlier = await this.earlier(req, key, start, until);
      if (earlier) return { res: earlier };
    }
    if (req.deadline && timestampMs(req.deadline) <= start) {
      return {
        res: this.failure(req, start, new ToolError(ErrorCode.TIMEOUT,
          `deadline ${new Date(timestampMs(req.deadline)).toISOString()} passed before the step started`)),
      };
    }
    let rev = 0;
    if (tool.effectful) {
      this.enter(key);
      try {
        const created = await this.retry(until, "create effect record", () => this.startEffect(key, this.base(req, start)));
        if (created === undefined) {
          this.leave(key);
          const earlier = await this.earlier(req, key, start, until);
          if (earlier) return { res: earlier };
          throw new Error(`effect record ${key} vanished while starting`);
        }
        rev = created;
      } catch (err) {
        this.leave(key);
        throw err;
      }
    }
    try {
      notice.start();
      let res: StepResult;
      try {
        const out = await this.runTool(tool, req, start, timeoutMs, until, traceparent);
        res = await this.output(req, start, out, tool.effectful);
      } catch (err) {
        if (err instanceof GivenBack) throw err; // the record stays "started": a redelivery escalates
        const terr = toToolError(err, req.tool);
        this.log.warn("step failed", { run_id: req.runId, step_id: req.stepId, tool: req.tool, code: ErrorCode[terr.code], err: terr.message });
        res = this.failure(req, start, terr);
        if (terr.retryable) {
          if (tool.effectful) {
            try {
              await this.retry(this.recordBy(until), "release effect record", () => this.effects.delete(`${this.pool}.${key}`, rev));
            } catch (derr) {
              this.log.warn("release effect record", { err: derr });
            }
          }
          return { res, retry: terr };
        }
      }
      if (tool.effectful) {
        try {
          await this.retry(this.recordBy(until), "record side effect result", () =>
            this.effects.update(`${this.pool}.${key}`, toBinary(StepResultSchema, res), rev));
        } catch (err) {
          // The effect happened; report it. A redelivery finds the record started and escalates.
          this.log.error("record side effect result", { err });
        }
      }
      return { res };
    } finally {
      if (tool.effectful) this.leave(key);
    }
  }

  private budget(tool: Tool, req: StepRequest, start: number): { timeoutMs: number; until: number } {
    let timeoutMs = this.o.defaultTimeoutMs;
    if (tool.def.defaultTimeoutMs && tool.def.defaultTimeoutMs > 0) timeoutMs = tool.def.defaultTimeoutMs;
    if (req.timeout && durationMs(req.timeout) > 0) timeoutMs = durationMs(req.timeout);
    let until = start + timeoutMs;
    if (req.deadline && timestampMs(req.deadline) < until) until = timestampMs(req.deadline);
    return { timeoutMs, until };
  }

  private recordBy(until: number): number {
    return Math.max(until, Date.now() + this.o.recordGraceMs);
  }

  private async runTool(tool: Tool, req: StepRequest, start: number, timeoutMs: number, until: number, traceparent?: string): Promise<JsonValue | undefined> {
    const ac = new AbortController();
    const end = Math.min(start + timeoutMs, until);
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ac.abort(new ToolError(ErrorCode.TIMEOUT, `${req.tool} did not finish within ${Math.round((end - start) / 1000 * 10) / 10}s`));
    }, Math.max(end - Date.now(), 0));
    const onStop = () => ac.abort(this.work.signal.reason);
    this.work.signal.addEventListener("abort", onStop, { once: true });
    const ctx: ToolContext = {
      runId: req.runId, stepId: req.stepId, attempt: req.attempt, planRevision: req.planRevision,
      executorId: this.replicaId, signal: ac.signal, deadline: new Date(end), traceparent,
    };
    try {
      const aborted = new Promise<never>((_, reject) => {
        if (ac.signal.aborted) reject(ac.signal.reason);
        ac.signal.addEventListener("abort", () => reject(ac.signal.reason), { once: true });
      });
      aborted.catch(() => {});
      const out = await Promise.race([Promise.resolve().then(() => tool.def.run(req.args ?? {}, ctx)), aborted]);
      return out;
    } catch (err) {
      if (timedOut && !(err instanceof ToolError)) {
        throw new ToolError(ErrorCode.TIMEOUT, `${req.tool} did not finish within its timeout`);
      }
      if (this.work.signal.aborted && !(err instanceof ToolError)) throw new GivenBack("executor stopping");
      throw err;
    } finally {
      clearTimeout(timer);
      this.work.signal.removeEventListener("abort", onStop);
    }
  }

  /** output builds the succeeded result: capped, inline or in the pool's object store. */
  private async output(req: StepRequest, start: number, out: JsonValue | undefined, effectful: boolean): Promise<StepResult> {
    const res = this.base(req, start);
    let value: JsonValue = out === undefined ? null : out;
    let data: Buffer;
    try {
      data = Buffer.from(JSON.stringify(value));
    } catch (err) {
      throw new ToolError(ErrorCode.INTERNAL, `${req.tool}: output is not JSON: ${(err as Error).message}`);
    }
    if (data.length > this.o.maxOutputBytes) {
      if (!Array.isArray(value)) {
        throw new ToolError(ErrorCode.TOOL_FAILED, `${req.tool}: output of ${data.length} bytes exceeds the ${this.o.maxOutputBytes} byte limit`);
      }
      const rows = [...value];
      while (rows.length > 0 && data.length > this.o.maxOutputBytes) {
        rows.splice(Math.max(1, Math.floor(rows.length * 0.9)));
        data = Buffer.from(JSON.stringify(rows));
      }
      value = rows;
      res.truncated = true;
    }
    if (data.length > this.o.inlineOutputBytes) {
      try {
        res.outputRef = await this.storeOutput(req, data);
      } catch (err) {
        if (!effectful) throw ToolError.unavailable(`could not store the output of ${req.tool}`, err);
        this.log.warn("store large output; keeping it inline", { err });
      }
    }
    if (res.outputRef === undefined) res.output = fromJson(ValueSchema, JSON.parse(data.toString("utf8")) as JsonValue);
    res.status = StepResultStatus.SUCCEEDED;
    res.duration = durationFromMs(Date.now() - start);
    return res;
  }

  private async storeOutput(req: StepRequest, data: Buffer): Promise<StepResult["outputRef"]> {
    this.outputs ??= this.openOutputs();
    let store: OutputStore;
    try {
      store = await this.outputs;
    } catch (err) {
      this.outputs = undefined;
      throw err;
    }
    const name = await this.retry(this.recordBy(0), `store output ${req.runId}/${req.stepId}/${req.attempt}`, () =>
      store.putOnce(`${req.runId}/${req.stepId}/${req.attempt}`, data));
    const sum = createHash("sha256").update(data).digest("hex");
    return { $typeName: "planex.v1.OutputRef", bucket: store.bucket, name, size: BigInt(data.length), sha256: sum };
  }

  /** openOutputs binds the pool's output bucket, creating it as the Go executors do when missing. */
  private async openOutputs(): Promise<OutputStore> {
    const bucket = `planex-outputs-${this.pool}`;
    const stream = `OBJ_${bucket}`;
    const jsm = await this.nc!.jetstreamManager({ timeout: this.o.callTimeoutMs });
    try {
      await jsm.streams.info(stream);
    } catch (err) {
      if (!/stream not found/i.test((err as Error).message)) throw err;
      try {
        await jsm.streams.add({
          name: stream,
          description: "large step outputs",
          subjects: [`$O.${bucket}.C.>`, `$O.${bucket}.M.>`],
          storage: StorageType.File,
          discard: DiscardPolicy.New,
          allow_rollup_hdrs: true,
          allow_direct: true,
          num_replicas: 1,
        });
      } catch (cerr) {
        if (!/already in use|already exists/i.test((cerr as Error).message)) throw cerr;
      }
    }
    return new OutputStore(this.nc!, this.js, bucket, this.o.callTimeoutMs);
  }

  // --- effect records -----------------------------------------------------

  /** startEffect creates the "started" record; undefined when another delivery created it first. */
  private async startEffect(key: string, started: StepResult): Promise<number | undefined> {
    try {
      return await this.effects.create(`${this.pool}.${key}`, toBinary(StepResultSchema, started));
    } catch (err) {
      if (err instanceof KeyExists) return undefined;
      throw err;
    }
  }

  /** readEffect reads the pool's record of an attempt, or else one of the layout before pools. */
  private async readEffect(key: string): Promise<StepResult | undefined> {
    for (const stored of [`${this.pool}.${key}`, key]) {
      const e = await this.effects.get(stored);
      if (e === null || e.operation !== "PUT") continue;
      return fromBinary(StepResultSchema, e.value);
    }
    return undefined;
  }

  /**
   * earlier looks for an earlier run of a side-effecting attempt: its
   * recorded result (replayed), or OUTCOME_UNKNOWN for an attempt that
   * started and whose owner no longer runs it; undefined when there is
   * none.
   */
  private async earlier(req: StepRequest, key: string, start: number, until: number): Promise<StepResult | undefined> {
    let rec = await this.retry(this.recordBy(until), "read effect record", () => this.readEffect(key));
    if (rec === undefined) return undefined;
    if (rec.status === StepResultStatus.UNSPECIFIED) rec = await this.awaitOwner(key, rec, until);
    if (rec === undefined) return undefined;
    if (rec.status !== StepResultStatus.UNSPECIFIED) {
      rec.replayed = true;
      this.log.info("replaying recorded result", { run_id: req.runId, step_id: req.stepId, tool: req.tool, status: StepResultStatus[rec.status] });
      return rec;
    }
    const at = rec.startedAt ? new Date(timestampMs(rec.startedAt)).toISOString() : "an unknown time";
    this.log.warn("attempt started earlier and never finished; escalating", { run_id: req.runId, step_id: req.stepId, tool: req.tool, started_by: rec.executorId });
    return this.failure(req, start, ToolError.outcomeUnknown(
      `attempt ${req.attempt} of ${req.tool} was started by executor ${rec.executorId} at ${at} and its outcome was never recorded; not repeating it`));
  }

  /** awaitOwner waits while the replica that started an attempt still runs it (docs: awaitOwner of the Go runner). */
  private async awaitOwner(key: string, rec: StepResult, until: number): Promise<StepResult | undefined> {
    let unreachableSince = 0;
    for (;;) {
      const state = await this.ownerRuns(key, rec.executorId);
      if (state === "running") unreachableSince = 0;
      else if (state === "unreachable" && unreachableSince === 0) unreachableSince = Date.now();
      else if (!(state === "unreachable" && Date.now() - unreachableSince < 3000)) return rec;
      if (Date.now() + 250 > until) return rec;
      await sleep(250);
      const next = await this.retry(this.recordBy(until), "read effect record", () => this.readEffect(key));
      if (next === undefined || next.status !== StepResultStatus.UNSPECIFIED || next.executorId !== rec.executorId) return next;
    }
  }

  private async ownerRuns(key: string, owner: string): Promise<"running" | "idle" | "unreachable"> {
    if (owner === this.replicaId) return (this.running.get(key) ?? 0) > 0 ? "running" : "idle";
    if (!tokenRE.test(owner)) return "idle";
    try {
      const reply = await this.nc!.request(`planex.executor.${this.pool}.${owner}.attempts`, new TextEncoder().encode(key), { timeout: this.o.callTimeoutMs });
      return new TextDecoder().decode(reply.data) === "running" ? "running" : "idle";
    } catch (err) {
      return (err as { code?: string }).code === "503" ? "unreachable" : "running";
    }
  }

  private enter(key: string): void {
    this.running.set(key, (this.running.get(key) ?? 0) + 1);
  }

  private leave(key: string): void {
    const n = (this.running.get(key) ?? 0) - 1;
    if (n <= 0) this.running.delete(key);
    else this.running.set(key, n);
  }

  // --- publishing -------------------------------------------------------

  /** publish sends a protobuf message to the engine stream with its message id. */
  async publish(subject: string, type: string, data: Uint8Array, msgID: string, traceparent?: string): Promise<void> {
    const h = natsHeaders();
    h.set(Names.headerType, type);
    if (traceparent) h.set("traceparent", traceparent);
    await this.js.publish(subject, data, { msgID, headers: h, timeout: this.o.callTimeoutMs });
  }

  private async publishResult(req: StepRequest, res: StepResult, traceparent?: string): Promise<void> {
    await this.retry(this.recordBy(0), "publish step result", () =>
      this.publish(`${Names.enginePrefix}${req.runId}.result`, "planex.v1.StepResult", toBinary(StepResultSchema, res),
        `${req.runId}:${req.stepId}:${req.attempt}:result`, traceparent));
  }

  /** The started notice of an attempt (heartbeat false), best effort. */
  publishStarted(req: StepRequest, delivered: number, traceparent?: string): void {
    let msgID = `${req.runId}:${req.stepId}:${req.attempt}:started`;
    if (delivered > 1) msgID += `:${delivered}`;
    const notice = create(StepStartedNoticeSchema, {
      runId: req.runId, stepId: req.stepId, attempt: req.attempt, executorId: this.replicaId, startedAt: timestampFromMs(Date.now()),
    });
    this.publish(`${Names.enginePrefix}${req.runId}.started`, "planex.v1.StepStartedNotice", toBinary(StepStartedNoticeSchema, notice), msgID, traceparent)
      .catch((err) => this.log.warn("publish step started notice", { err }));
  }

  /** One heartbeat of a started attempt, best effort. */
  async publishHeartbeat(req: StepRequest, at: number, n: number): Promise<void> {
    const notice = create(StepStartedNoticeSchema, {
      runId: req.runId, stepId: req.stepId, attempt: req.attempt, executorId: this.replicaId, heartbeat: true, heartbeatAt: timestampFromMs(at),
    });
    try {
      await this.publish(`${Names.enginePrefix}${req.runId}.started`, "planex.v1.StepStartedNotice", toBinary(StepStartedNoticeSchema, notice),
        `${req.runId}:${req.stepId}:${req.attempt}:hb:${n}`);
    } catch (err) {
      this.log.debug("publish heartbeat", { err });
    }
  }

  /** startedNoticeDelayMs is the delay before a started notice. */
  get startedNoticeDelayMs(): number {
    return this.o.startedNoticeDelayMs;
  }

  // --- helpers ----------------------------------------------------------

  private base(req: StepRequest, start: number): StepResult {
    return create(StepResultSchema, {
      runId: req.runId, stepId: req.stepId, attempt: req.attempt, planRevision: req.planRevision, tool: req.tool,
      executorId: this.replicaId, startedAt: timestampFromMs(start),
    });
  }

  private failure(req: StepRequest, start: number, e: ToolError): StepResult {
    const res = this.base(req, start);
    res.status = e.code === ErrorCode.OUTCOME_UNKNOWN ? StepResultStatus.OUTCOME_UNKNOWN : StepResultStatus.FAILED;
    res.error = { $typeName: "planex.v1.StepError", code: e.code, message: e.message, retryable: e.retryable, field: e.field ?? "" };
    res.duration = durationFromMs(Date.now() - start);
    return res;
  }

  /** retry calls op, each call bounded by the call timeout, while it fails transiently and until passes. */
  private async retry<T>(until: number, what: string, op: () => Promise<T>): Promise<T> {
    let backoff = 50;
    for (let tries = 1; ; tries++) {
      try {
        return await op();
      } catch (err) {
        if (permanent(err) || Date.now() + backoff > until) {
          throw new Error(`${what}: gave up after ${tries} tries: ${(err as Error).message}`, { cause: err });
        }
        this.log.debug("JetStream call failed; trying again", { op: what, tries, retry_in_ms: backoff, err });
        await sleep(backoff);
        backoff = Math.min(2 * backoff, 1000);
      }
    }
  }
}

/**
 * StartNotice is the lazily published started notice of one attempt and
 * the heartbeats after it: a step that ends within the started-notice
 * delay reports its start with its result; one with a heartbeat timeout,
 * or whose start_by is near, sends it at once.
 */
class StartNotice {
  private timer?: NodeJS.Timeout;
  private beats?: NodeJS.Timeout;
  private over = false;
  private sent = false;
  private last = 0;

  constructor(
    private readonly ex: Executor,
    private readonly req: StepRequest,
    private readonly delivered: number,
    private readonly traceparent?: string,
  ) {}

  start(): void {
    let delay = this.ex.startedNoticeDelayMs;
    const hb = this.req.heartbeatTimeout ? durationMs(this.req.heartbeatTimeout) : 0;
    if (hb > 0) delay = 0;
    if (this.req.startBy) delay = Math.min(delay, (timestampMs(this.req.startBy) - Date.now()) / 2);
    if (delay <= 0) this.publish();
    else this.timer = setTimeout(() => this.publish(), delay);
  }

  private publish(): void {
    if (this.over || this.sent) return;
    this.sent = true;
    this.ex.publishStarted(this.req, this.delivered, this.traceparent);
    const hb = this.req.heartbeatTimeout ? durationMs(this.req.heartbeatTimeout) : 0;
    if (hb <= 0) return;
    let busy = false;
    this.beats = setInterval(() => {
      if (busy || this.over) return; // one at a time: a slow acknowledgement delays the next
      busy = true;
      const now = Date.now();
      const n = Math.max(now, this.last + 1);
      this.last = n;
      this.ex.publishHeartbeat(this.req, now, n).finally(() => (busy = false));
    }, Math.max(hb / 3, 100));
  }

  /** cancel: the tool returned; a notice not sent yet never is. */
  cancel(): void {
    this.over = true;
    clearTimeout(this.timer);
  }

  /** stop ends the heartbeats too. */
  stop(): void {
    this.cancel();
    clearInterval(this.beats);
  }
}

/** KvSharedReplays is the planex-step-replay bucket seen by one pool. */
class KvSharedReplays implements SharedReplays {
  constructor(
    private readonly kv: Bucket,
    private readonly pool: string,
  ) {}

  async claim(sigHash: Buffer, streamSeq: number): Promise<void> {
    const key = `${this.pool}.${sigHash.toString("hex")}`;
    try {
      await this.kv.create(key, new TextEncoder().encode(String(streamSeq)));
      return;
    } catch (err) {
      if (!(err instanceof KeyExists)) throw new ReplayCacheUnavailable(err);
    }
    let first: number;
    try {
      const e = await this.kv.get(key);
      first = e === null ? NaN : Number(new TextDecoder().decode(e.value));
    } catch (err) {
      throw new ReplayCacheUnavailable(err);
    }
    if (first !== streamSeq || streamSeq === 0) {
      throw new StepRefused("replayed", `signature first accepted (by a replica of pool ${this.pool}) at stream sequence ${first}, again at ${streamSeq}`);
    }
  }
}

/** newReplicaId returns "<hostname>-<random hex>", unique per process start. */
export function newReplicaId(): string {
  let host = hostname().toLowerCase().replace(/[^a-z0-9-]/g, "-").slice(0, 48);
  if (host === "") host = "executor";
  return `${host}-${randomBytes(4).toString("hex")}`;
}

/** connectionOptions builds nats.js options from {@link NatsOptions} for pool's identity. */
export async function connectionOptions(o: NatsOptions, pool: string): Promise<ConnectionOptions> {
  if (!o || (typeof o.servers !== "string" && !Array.isArray(o.servers)) || o.servers.length === 0) {
    throw new Error("nats.servers: required (nats://host:port)");
  }
  const opts: ConnectionOptions = {
    servers: o.servers,
    name: `planex-executor-${pool}`,
    // NATS permissions give executor-<pool> its own inboxes only.
    inboxPrefix: `_INBOX_executor-${pool}`,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 500,
  };
  const ways = [o.nkeySeedFile, o.nkeySeed, o.credsFile, o.token, o.user].filter((v) => v !== undefined).length;
  if (ways > 1) throw new Error("nats: give one of nkeySeedFile, nkeySeed, credsFile, token, user/pass");
  const read = (name: string, path: string) => {
    try {
      return readFileSync(path);
    } catch (err) {
      throw new Error(`nats.${name} ${path}: ${(err as Error).message}`, { cause: err });
    }
  };
  if (o.nkeySeedFile !== undefined) opts.authenticator = nkeyAuthenticator(new Uint8Array(Buffer.from(read("nkeySeedFile", o.nkeySeedFile).toString("utf8").trim())));
  if (o.nkeySeed !== undefined) opts.authenticator = nkeyAuthenticator(new TextEncoder().encode(o.nkeySeed.trim()));
  if (o.credsFile !== undefined) opts.authenticator = credsAuthenticator(new Uint8Array(read("credsFile", o.credsFile)));
  if (o.token !== undefined) opts.authenticator = tokenAuthenticator(o.token);
  if (o.user !== undefined) opts.authenticator = usernamePasswordAuthenticator(o.user, o.pass ?? "");
  if (o.tls) {
    if ((o.tls.certFile === undefined) !== (o.tls.keyFile === undefined)) throw new Error("nats.tls: certFile and keyFile go together");
    opts.tls = { caFile: o.tls.caFile, certFile: o.tls.certFile, keyFile: o.tls.keyFile };
  }
  return opts;
}

function checkRequest(req: StepRequest): void {
  if (!tokenRE.test(req.runId)) throw new Error(`run_id ${JSON.stringify(req.runId)}: want a subject token`);
  if (req.stepId === "") throw new Error("step_id is empty");
  if (req.attempt < 1) throw new Error(`attempt ${req.attempt}: want >= 1`);
  if (req.tool === "") throw new Error("tool is empty");
}

function header(h: MsgHdrs | undefined, name: string): string | undefined {
  if (!h) return undefined;
  const v = h.get(name, Match.IgnoreCase);
  return v === "" ? undefined : v;
}

function toToolError(err: unknown, tool: string): ToolError {
  if (err instanceof ToolError) return err;
  const msg = err instanceof Error ? err.message : String(err);
  return new ToolError(ErrorCode.TOOL_FAILED, `${tool}: ${msg}`);
}

function permanent(err: unknown): boolean {
  const e = err as { api_error?: { err_code?: number; code?: number }; code?: string; message?: string };
  if (err instanceof KeyExists || isWrongLastSequence(err)) return true;
  if (e?.code === "CONNECTION_CLOSED") return true;
  if (/decod|invalid wire type|premature EOF|permissions violation/i.test(e?.message ?? "")) return true;
  const code = e?.api_error?.code;
  return code === 400 || code === 404;
}

/** nakDelay backs redeliveries off: 0.5 s, 1 s, 2 s … up to 30 s. */
function nakDelay(delivered: number): number {
  let d = 500;
  for (let i = 1; i < delivered && d < 30_000; i++) d *= 2;
  return Math.min(d, 30_000);
}

/** keepInProgress sends in-progress acks every interval until the returned function is called. */
function keepInProgress(m: JsMsg, interval: number): () => void {
  const t = setInterval(() => {
    try {
      m.working();
    } catch {
      // the next one may get through
    }
  }, interval);
  return () => clearInterval(t);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  let t: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((r) => (t = setTimeout(() => r(false), ms)));
  try {
    return await Promise.race([p.then(() => true), timeout]);
  } finally {
    clearTimeout(t);
  }
}

/**
 * serve runs an executor until SIGTERM or SIGINT (or signal aborts), then
 * stops it within graceMs (default 30 s). It resolves once the executor
 * stopped; it rejects when it could not start.
 */
export async function serve(opts: ExecutorOptions & { signal?: AbortSignal; graceMs?: number }): Promise<Executor> {
  const ex = new Executor(opts);
  await ex.start();
  await new Promise<void>((resolve) => {
    const done = () => {
      process.off("SIGTERM", done);
      process.off("SIGINT", done);
      resolve();
    };
    process.once("SIGTERM", done);
    process.once("SIGINT", done);
    if (opts.signal?.aborted) done();
    opts.signal?.addEventListener("abort", done, { once: true });
  });
  await ex.stop(opts.graceMs);
  return ex;
}
