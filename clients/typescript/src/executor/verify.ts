import { createHash, createPublicKey, verify as edVerify, type KeyObject } from "node:crypto";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

/** Header names of a signed step request (internal/stepsign). */
export const Headers = {
  signature: "Planex-Signature",
  keyId: "Planex-Key-Id",
  expires: "Planex-Expires",
  approval: "Planex-Approval",
} as const;

/**
 * MAX_VALIDITY_MS bounds how far ahead a signature may expire (48 h); it
 * also bounds how long the replay cache remembers a signature.
 */
export const MAX_VALIDITY_MS = 48 * 3600 * 1000;

/** Why a step request was refused; the values of the Go verifier's metric. */
export type RefusalReason = "unsigned" | "unknown_key" | "bad_signature" | "expired" | "replayed" | "no_approval";

/** StepRefused is thrown by {@link StepVerifier.verify} for a request that must never run. */
export class StepRefused extends Error {
  /** Why it was refused. */
  readonly reason: RefusalReason;
  constructor(reason: RefusalReason, detail?: string) {
    super(detail ? `${reason}: ${detail}` : reason);
    this.name = "StepRefused";
    this.reason = reason;
  }
}

/**
 * ReplayCacheUnavailable is thrown when the pool's shared replay cache
 * could not be asked: the request is neither run nor refused for good (the
 * executor gives it back for later).
 */
export class ReplayCacheUnavailable extends Error {
  constructor(cause: unknown) {
    super(`replay_cache_unavailable: ${(cause as Error)?.message ?? String(cause)}`, { cause });
    this.name = "ReplayCacheUnavailable";
  }
}

/**
 * SharedReplays is the replay cache the replicas of a pool share (the
 * planex-step-replay KV bucket). claim records a signature hash as
 * accepted under a stream sequence and throws {@link StepRefused}
 * ("replayed") when it was accepted under another one, or
 * {@link ReplayCacheUnavailable} when the bucket cannot be reached.
 */
export interface SharedReplays {
  claim(sigHash: Buffer, streamSeq: number, expiresMs: number): Promise<void>;
}

/** One delivered step request to verify. */
export interface VerifyRequest {
  /** Subject the message was published on (the signature covers it). */
  subject: string;
  /** Reads a header of the message. */
  header(name: string): string | undefined;
  /** The payload. */
  data: Uint8Array;
  /** Stream sequence: a redelivery has the same one, a replay another. */
  streamSeq: number;
  /** The tool, for messages. */
  tool: string;
  /** The tool requires approval (or is unknown): an approval proof must be signed in. */
  requiresApproval: boolean;
}

/**
 * keyIdOf is the key id of an ed25519 public key: hex of the first 8
 * bytes of SHA-256 of its raw 32 bytes.
 */
export function keyIdOf(pub: KeyObject): string {
  const jwk = pub.export({ format: "jwk" });
  if (typeof jwk.x !== "string") throw new Error("not an ed25519 public key");
  return createHash("sha256").update(Buffer.from(jwk.x, "base64url")).digest("hex").slice(0, 16);
}

/**
 * signedBytes is what a step signature covers:
 * "planex-step-v1\n<subject>\n<key id>\n<expires>\n<approval>\n<base64 SHA-256(payload)>".
 */
export function signedBytes(subject: string, keyId: string, expires: string, approval: string, data: Uint8Array): Buffer {
  const sum = createHash("sha256").update(data).digest("base64");
  return Buffer.from(`planex-step-v1\n${subject}\n${keyId}\n${expires}\n${approval}\n${sum}`);
}

/**
 * StepVerifier checks signed step requests against the trusted ed25519
 * public keys of a file or directory (*.pem, *.pub; PKIX PEM, re-read when
 * it changes), the same scheme as the Go executors (internal/stepsign), and
 * remembers the signatures it accepted to refuse replays.
 */
export class StepVerifier {
  private readonly keysPath: string;
  private readonly now: () => number;
  private stamp?: string;
  private keys = new Map<string, KeyObject>();
  private readonly seen = new Map<string, { seq: number; expires: number }>();
  private adds = 0;
  private shared?: SharedReplays;

  /** Loads the keys of keysPath; throws an Error naming the path when none is usable. */
  constructor(keysPath: string, options: { now?: () => number } = {}) {
    if (!keysPath) throw new Error("verifyKeys: required (a public key file or directory), or allowUnsignedSteps");
    this.keysPath = keysPath;
    this.now = options.now ?? Date.now;
    this.reload(true);
  }

  /** shareReplays puts the pool's shared replay cache behind the in-memory one. */
  shareReplays(shared: SharedReplays): void {
    this.shared = shared;
  }

  /** keyIds lists the trusted key ids. */
  keyIds(): string[] {
    return [...this.keys.keys()].sort();
  }

  private reload(strict: boolean): void {
    let files: string[];
    let stamp: string;
    try {
      ({ files, stamp } = keyFiles(this.keysPath));
    } catch (err) {
      if (strict) throw new Error(`verifyKeys ${this.keysPath}: ${(err as Error).message}`, { cause: err });
      return; // a broken key directory keeps the previous keys
    }
    if (stamp === this.stamp) return;
    const keys = new Map<string, KeyObject>();
    for (const f of files) {
      try {
        const k = createPublicKey(readFileSync(f));
        if (k.asymmetricKeyType !== "ed25519") throw new Error(`want ed25519, got ${k.asymmetricKeyType}`);
        keys.set(keyIdOf(k), k);
      } catch (err) {
        if (strict) throw new Error(`step verify key ${f}: ${(err as Error).message}`, { cause: err });
        return;
      }
    }
    if (keys.size === 0) {
      if (strict) throw new Error(`verifyKeys ${this.keysPath}: no ed25519 public key`);
      return;
    }
    this.keys = keys;
    this.stamp = stamp;
  }

  /**
   * verify accepts a correctly signed, unexpired, not replayed request
   * (with an approval proof when the tool requires approval); otherwise it
   * throws {@link StepRefused}, or {@link ReplayCacheUnavailable} when the
   * shared replay cache could not be asked.
   */
  async verify(r: VerifyRequest): Promise<void> {
    const sigB64 = r.header(Headers.signature) ?? "";
    const kid = r.header(Headers.keyId) ?? "";
    const expStr = r.header(Headers.expires) ?? "";
    if (sigB64 === "" || kid === "" || expStr === "") throw new StepRefused("unsigned");
    this.reload(false);
    const pub = this.keys.get(kid);
    if (pub === undefined) throw new StepRefused("unknown_key", `key id ${JSON.stringify(kid)} is not trusted`);
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(sigB64)) throw new StepRefused("bad_signature", "malformed signature");
    const sig = Buffer.from(sigB64, "base64");
    if (sig.length !== 64) throw new StepRefused("bad_signature", "malformed signature");
    if (!/^-?\d{1,19}$/.test(expStr)) throw new StepRefused("bad_signature", `malformed ${Headers.expires}`);
    const approval = r.header(Headers.approval) ?? "";
    if (!edVerify(null, signedBytes(r.subject, kid, expStr, approval, r.data), pub, sig)) {
      throw new StepRefused("bad_signature");
    }
    const expires = Number(expStr);
    const now = this.now();
    if (!(now < expires)) throw new StepRefused("expired", `at ${new Date(expires).toISOString()}`);
    if (expires - now > MAX_VALIDITY_MS) {
      throw new StepRefused("bad_signature", `expiry ${new Date(expires).toISOString()} is more than 48h away`);
    }
    if (r.requiresApproval && approval === "") throw new StepRefused("no_approval", `tool ${r.tool} requires approval`);
    await this.remember(createHash("sha256").update(sig).digest(), r.streamSeq, expires, now);
  }

  private async remember(hash: Buffer, seq: number, expires: number, now: number): Promise<void> {
    const key = hash.toString("hex");
    const replayed = (first: number) =>
      new StepRefused("replayed", `signature first seen at stream sequence ${first}, again at ${seq}`);
    const e = this.seen.get(key);
    if (e !== undefined && now < e.expires) {
      if (e.seq !== seq || seq === 0) throw replayed(e.seq);
      return;
    }
    if (this.shared !== undefined) await this.shared.claim(hash, seq, expires);
    const again = this.seen.get(key);
    if (again !== undefined && now < again.expires && (again.seq !== seq || seq === 0)) throw replayed(again.seq);
    this.seen.set(key, { seq, expires });
    if (++this.adds % 1024 === 0) {
      for (const [k, v] of this.seen) if (!(now < v.expires)) this.seen.delete(k);
    }
  }
}

function keyFiles(path: string): { files: string[]; stamp: string } {
  const st = statSync(path);
  if (!st.isDirectory()) return { files: [path], stamp: `${st.size}:${st.mtimeMs}` };
  const files: string[] = [];
  let stamp = "";
  for (const e of readdirSync(path, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
    const n = e.name;
    if (e.isDirectory() || n.startsWith(".") || !(n.endsWith(".pem") || n.endsWith(".pub"))) continue;
    const f = join(path, n);
    try {
      const s = statSync(f);
      stamp += `${n}:${s.size}:${s.mtimeMs};`;
      files.push(f);
    } catch {
      // vanished between the listing and the stat
    }
  }
  return { files, stamp };
}
