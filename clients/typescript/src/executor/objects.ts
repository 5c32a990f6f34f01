import { createHash, randomBytes } from "node:crypto";

import { Empty, headers as natsHeaders, type JetStreamClient, type NatsConnection } from "nats";

/** The part of an object's info the executor reads. */
export interface ObjectMeta {
  name: string;
  size: number;
  digest?: string;
  deleted?: boolean;
}

const chunkSize = 128 * 1024;

/** b64url is standard base64 with the URL alphabet and padding, like Go's base64.URLEncoding. */
function b64url(b: Buffer): string {
  return b.toString("base64").replace(/\+/g, "-").replace(/\//g, "_");
}

/** objectDigest is an object store digest: "SHA-256=" and the URL-safe base64 of the hash. */
export function objectDigest(data: Uint8Array): string {
  return "SHA-256=" + b64url(createHash("sha256").update(data).digest());
}

/**
 * OutputStore writes a pool's large step outputs into its JetStream object
 * store (planex-outputs-<pool>) in the object store's wire format (chunks
 * on $O.<bucket>.C.<nuid>, then the meta message on
 * $O.<bucket>.M.<base64 name> with a subject rollup), with only what an
 * executor identity may do: publish to its bucket and look up an
 * object's meta with a direct get naming it. It never replaces or purges
 * an object.
 */
export class OutputStore {
  constructor(
    private readonly nc: NatsConnection,
    private readonly js: JetStreamClient,
    /** The bucket's name. */
    readonly bucket: string,
    private readonly timeoutMs: number,
  ) {}

  private metaSubject(name: string): string {
    return `$O.${this.bucket}.M.${b64url(Buffer.from(name))}`;
  }

  /** info reads an object's meta; null when there is none. */
  async info(name: string): Promise<ObjectMeta | null> {
    const m = await this.nc.request(`$JS.API.DIRECT.GET.OBJ_${this.bucket}.${this.metaSubject(name)}`, Empty, { timeout: this.timeoutMs });
    if (m.headers?.hasError) {
      if (m.headers.code === 404) return null;
      throw new Error(`look up output ${name}: ${m.headers.code} ${m.headers.description}`);
    }
    return JSON.parse(new TextDecoder().decode(m.data)) as ObjectMeta;
  }

  /** put stores data as a new object name. */
  async put(name: string, data: Uint8Array): Promise<void> {
    const nuid = randomBytes(12).toString("hex");
    let chunks = 0;
    for (let off = 0; off < data.length; off += chunkSize) {
      await this.js.publish(`$O.${this.bucket}.C.${nuid}`, data.subarray(off, off + chunkSize), { timeout: this.timeoutMs });
      chunks++;
    }
    const meta = {
      name,
      options: { max_chunk_size: chunkSize },
      bucket: this.bucket,
      nuid,
      size: data.length,
      mtime: new Date().toISOString(),
      chunks,
      digest: objectDigest(data),
    };
    const h = natsHeaders();
    h.set("Nats-Rollup", "sub");
    await this.js.publish(this.metaSubject(name), new TextEncoder().encode(JSON.stringify(meta)), { headers: h, timeout: this.timeoutMs });
  }

  /**
   * putOnce stores data under name, or, when name holds other bytes (an
   * attempt that ran again after its answer was lost), under name plus
   * "/" and a unique suffix; the same bytes already there are reused. It
   * returns the name the data is stored under (bus.PutOutputOnce).
   */
  async putOnce(name: string, data: Uint8Array): Promise<string> {
    const digest = objectDigest(data);
    for (let i = 0, n = name; ; i++, n = `${name}/${randomBytes(8).toString("hex")}`) {
      const info = await this.info(n);
      if (info === null) {
        await this.put(n, data);
        return n;
      }
      if (!info.deleted && info.digest === digest && info.size === data.length) return n;
      if (i >= 3) throw new Error(`store output ${name}: every name tried is taken`);
    }
  }
}
