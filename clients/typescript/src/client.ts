import { readFileSync } from "node:fs";
import { toJson, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, createClient as createConnectClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { toPlanexError } from "./errors.js";
import { DecisionKind, RunStatus, type Run, type RunEvent } from "./gen/planex/v1/run_pb.js";
import {
  SupervisorService,
  type CancelRunRequestSchema,
  type DecideRequestSchema,
  type ForkRunRequestSchema,
  type ForkRunResponse,
  type ListGatesRequestSchema,
  type ListRunsRequestSchema,
  type ListRunsResponse,
  type ListToolsRequestSchema,
  type OpenGate,
  type RegisteredTool,
  type ResetRunRequestSchema,
  type ResetRunResponse,
  type StartRunRequestSchema,
  type StartRunResponse,
} from "./gen/planex/v1/supervisor_pb.js";

/** PEM data: the file's contents (not its path). */
export type Pem = string | Buffer;

/**
 * TLS settings of a client. Each of ca, cert and key is given either as
 * PEM data or as a file path (caFile, certFile, keyFile); without ca the
 * system's roots verify the server. cert and key together present a
 * client certificate (mTLS).
 */
export interface TlsOptions {
  /** CA bundle (PEM) that verifies the supervisor's certificate. */
  ca?: Pem;
  /** Path of the CA bundle. */
  caFile?: string;
  /** Client certificate (PEM), for mTLS. */
  cert?: Pem;
  /** Path of the client certificate. */
  certFile?: string;
  /** Client private key (PEM), for mTLS. */
  key?: Pem;
  /** Path of the client private key. */
  keyFile?: string;
  /** Name the server's certificate must carry, when not the address's host. */
  serverName?: string;
}

/** Options of {@link createClient}. */
export interface ClientOptions {
  /**
   * The supervisor's gRPC address: "host:port" (TLS unless plaintext is
   * set), or a URL "https://host:port" / "http://host:port".
   */
  address: string;
  /** API key sent as "authorization: Bearer <token>". */
  token?: string;
  /** File holding the API key (read once, trimmed); planex dev writes credentials/cli.token. */
  tokenFile?: string;
  /** TLS settings; ignored with plaintext. */
  tls?: TlsOptions;
  /** Speak gRPC without TLS (h2c), as a supervisor started with --plaintext expects. */
  plaintext?: boolean;
  /** Timeout of each unary call in milliseconds (default 30000); watchRun has none. */
  timeoutMs?: number;
  /** Extra Connect interceptors (logging, tracing). */
  interceptors?: Interceptor[];
}

/** Per-call options. */
export interface CallOptions {
  /** Aborts the call. */
  signal?: AbortSignal;
  /** Overrides the client's timeout for this call, in milliseconds. */
  timeoutMs?: number;
}

/** Options of {@link PlanexClient.watchRun}. */
export interface WatchOptions {
  /** First event sequence to deliver (default 1: the whole log). */
  fromSequence?: bigint | number;
  /** Ends the watch: the iterator then throws the signal's reason. */
  signal?: AbortSignal;
  /**
   * How many times in a row a dropped stream is resumed (from the last
   * event's sequence + 1) before the error is thrown; default 10. Any
   * event received resets the count.
   */
  maxResumes?: number;
}

/** A decision by name or as the DecisionKind enum. */
export type Decision = DecisionKind | "approve" | "reject" | "edit";

/** The request of {@link PlanexClient.decide}; decision may be a name. */
export type DecideInit = Omit<MessageInitShape<typeof DecideRequestSchema>, "decision" | "$typeName"> & { decision?: Decision };

/** Run statuses after which nothing more happens to a run. */
export const terminalStatuses: ReadonlySet<RunStatus> = new Set([
  RunStatus.SUCCEEDED,
  RunStatus.FAILED,
  RunStatus.ESCALATED,
  RunStatus.CANCELLED,
]);

/** runResult is a run's answer (Run.result) as a plain JSON value; undefined while it has none. */
export function runResult(run: Pick<Run, "result">): JsonValue | undefined {
  return run.result === undefined ? undefined : toJson(ValueSchema, run.result);
}

/** isTerminal reports whether a run has finished. */
export function isTerminal(run: Pick<Run, "status"> | undefined): boolean {
  return run !== undefined && terminalStatuses.has(run.status);
}

// Codes after which a watch stream is resumed: the connection or the
// supervisor replica went away, not the request. (A stream the transport
// closed is Canceled too; the caller's own cancellation is told apart by
// its signal.)
const resumable = new Set<Code>([Code.Unavailable, Code.Internal, Code.Aborted, Code.Unknown, Code.Canceled]);

/**
 * PlanexClient calls the supervisor's public API (planex.v1.SupervisorService)
 * over gRPC. Every method rejects with a {@link PlanexError}. Create it
 * with {@link createClient}; close it when done.
 */
export class PlanexClient {
  /** The generated Connect client, for calls the wrapper does not cover (RunBatch). */
  readonly raw: Client<typeof SupervisorService>;
  private readonly timeoutMs: number;
  private readonly sessions: Http2SessionManager;

  /** @internal use {@link createClient}. */
  constructor(raw: Client<typeof SupervisorService>, sessions: Http2SessionManager, timeoutMs: number) {
    this.raw = raw;
    this.sessions = sessions;
    this.timeoutMs = timeoutMs;
  }

  /**
   * startRun creates a run for a goal (a string, or the whole
   * StartRunRequest) and returns it; with an idempotency key, a repeated
   * call returns the first run with existing set.
   */
  async startRun(req: string | MessageInitShape<typeof StartRunRequestSchema>, opts?: CallOptions): Promise<StartRunResponse> {
    const init = typeof req === "string" ? { goal: req } : req;
    return this.call((o) => this.raw.startRun(init, o), opts);
  }

  /** getRun returns the current state of a run. */
  async getRun(runId: string, opts?: CallOptions): Promise<Run> {
    const res = await this.call((o) => this.raw.getRun({ runId }, o), opts);
    return mustRun(res.run, "GetRun");
  }

  /** listRuns lists one page of runs, newest first. */
  async listRuns(req: MessageInitShape<typeof ListRunsRequestSchema> = {}, opts?: CallOptions): Promise<ListRunsResponse> {
    return this.call((o) => this.raw.listRuns(req, o), opts);
  }

  /**
   * watchRun yields a run's events in order, from fromSequence on, and
   * returns after the run's final event. A stream that drops (the
   * connection or the supervisor replica went away) is resumed from the
   * last event's sequence + 1, so no event is lost or repeated.
   */
  async *watchRun(runId: string, opts: WatchOptions = {}): AsyncGenerator<RunEvent, void, undefined> {
    let next = BigInt(opts.fromSequence ?? 1);
    if (next < 1n) next = 1n;
    const maxResumes = opts.maxResumes ?? 10;
    let failures = 0;
    for (;;) {
      try {
        for await (const res of this.raw.watchRun({ runId, fromSequence: next }, { signal: opts.signal })) {
          const ev = res.event;
          if (ev === undefined || ev.sequence < next) continue;
          next = ev.sequence + 1n;
          failures = 0;
          yield ev;
        }
        return;
      } catch (err) {
        if (opts.signal?.aborted) throw opts.signal.reason ?? err;
        const e = toPlanexError(err);
        if (!("code" in e) || !resumable.has((e as { code: Code }).code) || ++failures > maxResumes) throw e;
        await sleep(Math.min(100 * 2 ** (failures - 1), 5000), opts.signal);
      }
    }
  }

  /**
   * decide answers an open gate (approve, reject or edit), or several at
   * once with decisions, and returns the run after the decision.
   */
  async decide(req: DecideInit, opts?: CallOptions): Promise<Run> {
    const init: MessageInitShape<typeof DecideRequestSchema> = { ...req, decision: decisionOf(req.decision) };
    const res = await this.call((o) => this.raw.decide(init, o), opts);
    return mustRun(res.run, "Decide");
  }

  /** cancelRun stops a run and returns it. */
  async cancelRun(runId: string, reason = "", opts?: CallOptions): Promise<Run> {
    const req: MessageInitShape<typeof CancelRunRequestSchema> = { runId, reason };
    const res = await this.call((o) => this.raw.cancelRun(req, o), opts);
    return mustRun(res.run, "CancelRun");
  }

  /** listGates lists the open gates (of one run when runId is set), oldest first. */
  async listGates(runId = "", opts?: CallOptions): Promise<OpenGate[]> {
    const req: MessageInitShape<typeof ListGatesRequestSchema> = { runId };
    const res = await this.call((o) => this.raw.listGates(req, o), opts);
    return res.gates;
  }

  /** listTools lists the tool catalog (of one pool when pool is set), sorted by name. */
  async listTools(pool = "", opts?: CallOptions): Promise<RegisteredTool[]> {
    const req: MessageInitShape<typeof ListToolsRequestSchema> = { pool };
    const res = await this.call((o) => this.raw.listTools(req, o), opts);
    return res.tools;
  }

  /** resetRun re-opens a finished run (operator role). */
  async resetRun(req: MessageInitShape<typeof ResetRunRequestSchema>, opts?: CallOptions): Promise<ResetRunResponse> {
    return this.call((o) => this.raw.resetRun(req, o), opts);
  }

  /** forkRun starts a new run from another run's history (operator role). */
  async forkRun(req: MessageInitShape<typeof ForkRunRequestSchema>, opts?: CallOptions): Promise<ForkRunResponse> {
    return this.call((o) => this.raw.forkRun(req, o), opts);
  }

  /** close ends the client's HTTP/2 connection; calls after it fail. */
  close(): void {
    this.sessions.abort();
  }

  private async call<T>(fn: (o: { signal?: AbortSignal; timeoutMs?: number }) => Promise<T>, opts?: CallOptions): Promise<T> {
    try {
      return await fn({ signal: opts?.signal, timeoutMs: opts?.timeoutMs ?? this.timeoutMs });
    } catch (err) {
      throw toPlanexError(err);
    }
  }
}

/**
 * createClient returns a client of the supervisor at options.address:
 *
 *     const planex = createClient({ address: "127.0.0.1:7400", tokenFile, tls: { caFile } });
 *     const { run } = await planex.startRun("How many open tickets does Acme have?");
 *     for await (const ev of planex.watchRun(run!.id)) console.log(ev.payload.case);
 *
 * It throws an Error naming the option when the options are invalid.
 */
export function createClient(options: ClientOptions): PlanexClient {
  if (!options || typeof options.address !== "string" || options.address.trim() === "") {
    throw new Error("createClient: address: required (host:port or https://host:port)");
  }
  const baseUrl = baseUrlOf(options.address.trim(), options.plaintext === true);
  let token = options.token;
  if (token === undefined && options.tokenFile !== undefined) {
    token = readOption("tokenFile", options.tokenFile).toString("utf8").trim();
  }
  if (token !== undefined && (token === "" || /[\r\n]/.test(token))) {
    throw new Error("createClient: token: must be a non-empty single line");
  }
  const interceptors: Interceptor[] = [...(options.interceptors ?? [])];
  if (token !== undefined) {
    const header = `Bearer ${token}`;
    interceptors.unshift((next) => async (req) => {
      req.header.set("authorization", header);
      return next(req);
    });
  }
  const nodeOptions = baseUrl.startsWith("https:") ? tlsNodeOptions(options.tls) : {};
  const sessions = new Http2SessionManager(baseUrl, { pingIntervalMs: 30_000, idleConnectionTimeoutMs: 60_000 }, nodeOptions);
  const transport = createGrpcTransport({ baseUrl, sessionManager: sessions, interceptors });
  const timeoutMs = options.timeoutMs ?? 30_000;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new Error(`createClient: timeoutMs ${options.timeoutMs}: want a positive number of milliseconds`);
  }
  return new PlanexClient(createConnectClient(SupervisorService, transport), sessions, timeoutMs);
}

function baseUrlOf(address: string, plaintext: boolean): string {
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(address)) {
    let u: URL;
    try {
      u = new URL(address);
    } catch {
      throw new Error(`createClient: address ${JSON.stringify(address)}: not a URL`);
    }
    if (u.protocol !== "https:" && u.protocol !== "http:") {
      throw new Error(`createClient: address ${JSON.stringify(address)}: want http:// or https://`);
    }
    if (plaintext && u.protocol === "https:") {
      throw new Error("createClient: plaintext: conflicts with an https:// address");
    }
    return u.origin;
  }
  if (!/^(\[[0-9a-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/i.test(address)) {
    throw new Error(`createClient: address ${JSON.stringify(address)}: want host:port`);
  }
  return `${plaintext ? "http" : "https"}://${address}`;
}

function tlsNodeOptions(tls: TlsOptions = {}): { ca?: Pem; cert?: Pem; key?: Pem; servername?: string } {
  const pick = (name: string, data: Pem | undefined, file: string | undefined): Pem | undefined => {
    if (data !== undefined && file !== undefined) {
      throw new Error(`createClient: tls.${name}: conflicts with tls.${name}File`);
    }
    return file !== undefined ? readOption(`tls.${name}File`, file) : data;
  };
  const ca = pick("ca", tls.ca, tls.caFile);
  const cert = pick("cert", tls.cert, tls.certFile);
  const key = pick("key", tls.key, tls.keyFile);
  if ((cert === undefined) !== (key === undefined)) {
    throw new Error(`createClient: tls.${cert === undefined ? "cert" : "key"}: required with tls.${cert === undefined ? "key" : "cert"} (mTLS needs both)`);
  }
  const out: { ca?: Pem; cert?: Pem; key?: Pem; servername?: string } = {};
  if (ca !== undefined) out.ca = ca;
  if (cert !== undefined) out.cert = cert;
  if (key !== undefined) out.key = key;
  if (tls.serverName !== undefined) out.servername = tls.serverName;
  return out;
}

function readOption(name: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new Error(`createClient: ${name} ${path}: ${(err as Error).message}`, { cause: err });
  }
}

function decisionOf(d: Decision | undefined): DecisionKind | undefined {
  switch (d) {
    case "approve":
      return DecisionKind.APPROVE;
    case "reject":
      return DecisionKind.REJECT;
    case "edit":
      return DecisionKind.EDIT;
    default:
      return d;
  }
}

function mustRun(run: Run | undefined, method: string): Run {
  if (run === undefined) throw new Error(`${method}: the supervisor returned no run`);
  return run;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
