// Test harness: a real `planex dev` in a child process, on free ports and
// a temporary data directory, and helpers to poll for conditions.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (this file is clients/typescript/{src,dist}/test/harness.*). */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

let built: string | undefined;

/**
 * planexBinary is $PLANEX_BINARY, or a planex built from the repository
 * once per test process (`go build ./cmd/planex`).
 */
export function planexBinary(): string {
  if (process.env.PLANEX_BINARY) return process.env.PLANEX_BINARY;
  if (built) return built;
  const out = join(mkdtempSync(join(tmpdir(), "planex-ts-bin-")), "planex");
  const r = spawnSync("go", ["build", "-o", out, "./cmd/planex"], { cwd: repoRoot, encoding: "utf8" });
  if (r.status !== 0) throw new Error(`go build ./cmd/planex: ${r.error?.message ?? ""}\n${r.stderr}`);
  built = out;
  return out;
}

/** A running planex dev. */
export interface DevStack {
  addr: string;
  natsUrl: string;
  dataDir: string;
  credentialsDir: string;
  caFile: string;
  tokenFile: string;
  /** Environment the stack's CLI commands need (its config directory). */
  env: NodeJS.ProcessEnv;
  /** The dev process's stderr so far. */
  stderr(): string;
  stop(): Promise<void>;
}

/** startDev starts `planex dev` with extra flags and waits until it serves. */
export async function startDev(extra: string[] = [], timeoutMs = 180_000): Promise<DevStack> {
  const work = mkdtempSync(join(tmpdir(), "planex-ts-dev-"));
  const dataDir = join(work, "data");
  const env = { ...process.env, XDG_CONFIG_HOME: join(work, "config"), XDG_CACHE_HOME: join(work, "cache") };
  mkdirSync(env.XDG_CONFIG_HOME, { recursive: true });
  const child = spawn(planexBinary(), ["dev", `--data-dir=${dataDir}`, "--grpc-addr=127.0.0.1:0", "--mcp-addr=", ...extra], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (err = (err + d).slice(-200_000)));
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      if ((await Promise.race([exited.then(() => true), delay(20_000).then(() => false)])) === false) child.kill("SIGKILL");
      await exited;
    }
    rmSync(work, { recursive: true, force: true });
  };
  try {
    await waitFor(`planex dev to serve (stdout so far: ${JSON.stringify(out)})`, timeoutMs, async () => {
      if (child.exitCode !== null) throw new Error(`planex dev exited ${child.exitCode}:\n${err.slice(-4000)}`);
      return out.includes("Ctrl-C stops");
    });
  } catch (e) {
    await stop();
    throw e;
  }
  const field = (name: string) => {
    const m = new RegExp(`^\\s+${name}\\s+(\\S+)`, "m").exec(out);
    if (!m) throw new Error(`planex dev printed no ${name}:\n${out}`);
    return m[1];
  };
  const credentialsDir = field("credentials");
  return {
    addr: field("supervisor"),
    natsUrl: field("nats"),
    dataDir,
    credentialsDir,
    caFile: join(credentialsDir, "ca.pem"),
    tokenFile: join(credentialsDir, "cli.token"),
    env,
    stderr: () => err,
    stop,
  };
}

/** A child process whose output is kept. */
export interface Proc {
  child: ChildProcess;
  stdout(): string;
  stderr(): string;
  /** Sends SIGTERM and waits for the exit code (SIGKILL after 20 s). */
  stop(): Promise<number | null>;
}

/** startProc starts a command and keeps its output. */
export function startProc(cmd: string, args: string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv } = {}): Proc {
  const child = spawn(cmd, args, { cwd: opts.cwd, env: opts.env ?? process.env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (out += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (err += d));
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  return {
    child,
    stdout: () => out,
    stderr: () => err,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        if ((await Promise.race([exited.then(() => true), delay(20_000).then(() => false)])) === false) child.kill("SIGKILL");
      }
      return exited;
    },
  };
}

/** runPlanex runs a planex CLI command and returns its output; it throws on a non-zero exit. */
export function runPlanex(args: string[], env: NodeJS.ProcessEnv): string {
  const r = spawnSync(planexBinary(), args, { env, encoding: "utf8", timeout: 60_000 });
  if (r.status !== 0) throw new Error(`planex ${args.join(" ")}: exit ${r.status}\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** waitFor polls cond (every 50 ms) until it returns true, or throws after timeoutMs naming what. */
export async function waitFor(what: string, timeoutMs: number, cond: () => boolean | Promise<boolean>): Promise<void> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      if (await cond()) return;
    } catch (err) {
      last = err;
      if ((err as Error).message?.includes("exited")) throw err;
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ""}`);
    await delay(50);
  }
}

/** delay resolves after ms. */
export function delay(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** jsonLines parses the JSON lines of a log, skipping the others. */
export function jsonLines(text: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith("{")) continue;
    try {
      out.push(JSON.parse(line));
    } catch {
      // a line cut by the read
    }
  }
  return out;
}
