import { Empty, headers as natsHeaders, type JetStreamClient, type NatsConnection } from "nats";

/** An entry read from a bucket. */
export interface KvEntry {
  value: Uint8Array;
  revision: number;
  operation: "PUT" | "DEL" | "PURGE";
}

/** KeyExists is thrown by {@link Bucket.create} when the key holds a value. */
export class KeyExists extends Error {
  constructor(key: string) {
    super(`key ${key} exists`);
    this.name = "KeyExists";
  }
}

const expectLastSubjectSeq = "Nats-Expected-Last-Subject-Sequence";

/**
 * Bucket is a JetStream KV bucket reduced to what an executor's NATS
 * identity may do (internal/natsauth): publish to its own keys and read
 * them with a direct get whose subject names the key
 * ($JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>). nats.js's KV reads
 * through other API subjects (STREAM.MSG.GET, or a direct get with the
 * key in the body), which those permissions refuse.
 */
export class Bucket {
  constructor(
    private readonly nc: NatsConnection,
    private readonly js: JetStreamClient,
    /** The bucket's name. */
    readonly name: string,
    private readonly timeoutMs: number,
  ) {}

  private subject(key: string): string {
    return `$KV.${this.name}.${key}`;
  }

  /** put writes key and returns its revision. */
  async put(key: string, value: Uint8Array): Promise<number> {
    return (await this.js.publish(this.subject(key), value, { timeout: this.timeoutMs })).seq;
  }

  /**
   * create writes key only when it holds no value (never written, or
   * deleted) and returns its revision; it throws {@link KeyExists} otherwise.
   */
  async create(key: string, value: Uint8Array): Promise<number> {
    try {
      return await this.update(key, value, 0);
    } catch (err) {
      if (!isWrongLastSequence(err)) throw err;
    }
    const e = await this.get(key);
    if (e === null || e.operation === "PUT") throw new KeyExists(key);
    try {
      return await this.update(key, value, e.revision);
    } catch (err) {
      if (isWrongLastSequence(err)) throw new KeyExists(key);
      throw err;
    }
  }

  /** update writes key when its last revision is revision (0: never written). */
  async update(key: string, value: Uint8Array, revision: number): Promise<number> {
    const h = natsHeaders();
    h.set(expectLastSubjectSeq, String(revision));
    return (await this.js.publish(this.subject(key), value, { headers: h, timeout: this.timeoutMs })).seq;
  }

  /** delete puts a delete marker on key, when its last revision is revision (if given). */
  async delete(key: string, revision?: number): Promise<void> {
    const h = natsHeaders();
    h.set("KV-Operation", "DEL");
    if (revision !== undefined) h.set(expectLastSubjectSeq, String(revision));
    await this.js.publish(this.subject(key), Empty, { headers: h, timeout: this.timeoutMs });
  }

  /** get reads the last entry of key; null when it was never written. */
  async get(key: string): Promise<KvEntry | null> {
    const m = await this.nc.request(`$JS.API.DIRECT.GET.KV_${this.name}.${this.subject(key)}`, Empty, { timeout: this.timeoutMs });
    const h = m.headers;
    if (h && h.hasError) {
      if (h.code === 404) return null;
      throw new Error(`read ${this.name} ${key}: ${h.code} ${h.description}`);
    }
    const op = h?.get("KV-Operation") ?? "";
    return {
      value: m.data,
      revision: Number(h?.get("Nats-Sequence") ?? 0),
      operation: op === "DEL" || op === "PURGE" ? op : "PUT",
    };
  }
}

/** isWrongLastSequence: the server refused a write expecting another last revision. */
export function isWrongLastSequence(err: unknown): boolean {
  const e = err as { api_error?: { err_code?: number }; message?: string };
  return e?.api_error?.err_code === 10071 || /wrong last sequence/i.test(e?.message ?? "");
}
