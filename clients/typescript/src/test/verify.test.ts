// The step verifier and the argument validation, without NATS: the same
// signature scheme as internal/stepsign (keys written as PKIX PEM like
// `planex auth step-key`), every refusal reason, and Go-style field paths.
import assert from "node:assert/strict";
import { generateKeyPairSync, sign, type KeyObject } from "node:crypto";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { checkArgs, compileArgsSchema } from "../executor/schema.js";
import { Headers, StepRefused, StepVerifier, keyIdOf, signedBytes, ReplayCacheUnavailable, type SharedReplays } from "../executor/verify.js";

function keyPair(): { priv: KeyObject; pub: KeyObject; id: string } {
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  return { priv: privateKey, pub: publicKey, id: keyIdOf(publicKey) };
}

function keyDir(...pubs: KeyObject[]): string {
  const dir = mkdtempSync(join(tmpdir(), "planex-ts-keys-"));
  for (const p of pubs) writeFileSync(join(dir, `${keyIdOf(p)}.pem`), p.export({ type: "spki", format: "pem" }));
  return dir;
}

const subject = "planex.steps.tsdemo.greet";
const data = new TextEncoder().encode("a step request");

function signed(k: { priv: KeyObject; id: string }, opts: { expires?: number; approval?: string; subject?: string } = {}): Map<string, string> {
  const expires = String(opts.expires ?? Date.now() + 60_000);
  const h = new Map<string, string>([[Headers.keyId, k.id], [Headers.expires, expires]]);
  if (opts.approval) h.set(Headers.approval, opts.approval);
  h.set(Headers.signature, sign(null, signedBytes(opts.subject ?? subject, k.id, expires, opts.approval ?? "", data), k.priv).toString("base64"));
  return h;
}

function req(h: Map<string, string>, seq: number, requiresApproval = false) {
  return { subject, header: (n: string) => h.get(n), data, streamSeq: seq, tool: "tsdemo.greet", requiresApproval };
}

async function refused(p: Promise<void>, reason: string): Promise<void> {
  await assert.rejects(p, (err: unknown) => err instanceof StepRefused && err.reason === reason);
}

describe("StepVerifier", () => {
  it("accepts a signed request and its redelivery, refuses its replay", async () => {
    const k = keyPair();
    const v = new StepVerifier(keyDir(k.pub));
    const h = signed(k);
    await v.verify(req(h, 7));
    await v.verify(req(h, 7)); // a redelivery: same stream sequence
    await refused(v.verify(req(h, 8)), "replayed");
  });

  it("refuses what is not signed by a trusted key", async () => {
    const k = keyPair();
    const other = keyPair();
    const v = new StepVerifier(keyDir(k.pub));
    await refused(v.verify(req(new Map(), 1)), "unsigned");
    await refused(v.verify(req(signed(other), 1)), "unknown_key");
    await refused(v.verify(req(signed({ priv: other.priv, id: k.id }), 1)), "bad_signature");
    await refused(v.verify(req(signed(k, { subject: "planex.steps.tsdemo.note" }), 1)), "bad_signature");
    const forgedApproval = signed(k);
    forgedApproval.set(Headers.approval, "gate=g1;decision=approve;by=mallory");
    await refused(v.verify(req(forgedApproval, 1)), "bad_signature");
    const badExpiry = signed(k);
    badExpiry.set(Headers.expires, "soon");
    await refused(v.verify(req(badExpiry, 1)), "bad_signature");
  });

  it("checks expiry and the approval proof", async () => {
    const k = keyPair();
    const v = new StepVerifier(keyDir(k.pub));
    await refused(v.verify(req(signed(k, { expires: Date.now() - 1 }), 1)), "expired");
    await refused(v.verify(req(signed(k, { expires: Date.now() + 49 * 3600_000 }), 2)), "bad_signature");
    await refused(v.verify(req(signed(k), 3, true)), "no_approval");
    await v.verify(req(signed(k, { approval: "gate=g1;decision=approve;by=ada" }), 4, true));
  });

  it("follows key rotation in its directory", async () => {
    const old = keyPair();
    const next = keyPair();
    const dir = keyDir(old.pub);
    const v = new StepVerifier(dir);
    await refused(v.verify(req(signed(next), 1)), "unknown_key");
    writeFileSync(join(dir, `${next.id}.pem`), next.pub.export({ type: "spki", format: "pem" }));
    await v.verify(req(signed(next), 2));
    rmSync(join(dir, `${old.id}.pem`));
    await refused(v.verify(req(signed(old), 3)), "unknown_key");
    assert.deepEqual(v.keyIds(), [next.id]);
  });

  it("asks the pool's shared cache about signatures it has not seen", async () => {
    const k = keyPair();
    const claimed = new Map<string, number>();
    let down = false;
    const shared: SharedReplays = {
      async claim(hash, seq) {
        if (down) throw new ReplayCacheUnavailable(new Error("no responders"));
        const first = claimed.get(hash.toString("hex"));
        if (first === undefined) claimed.set(hash.toString("hex"), seq);
        else if (first !== seq) throw new StepRefused("replayed", "by another replica");
      },
    };
    const h = signed(k);
    const a = new StepVerifier(keyDir(k.pub));
    const b = new StepVerifier(keyDir(k.pub));
    a.shareReplays(shared);
    b.shareReplays(shared);
    await a.verify(req(h, 5));
    await refused(b.verify(req(h, 6)), "replayed"); // replayed to another replica
    down = true;
    await assert.rejects(b.verify(req(signed(k), 9)), ReplayCacheUnavailable);
  });

  it("names a missing or broken key path", () => {
    assert.throws(() => new StepVerifier(""), /verifyKeys: required/);
    assert.throws(() => new StepVerifier("/nonexistent/keys"), /verifyKeys \/nonexistent\/keys/);
    const dir = mkdtempSync(join(tmpdir(), "planex-ts-keys-"));
    assert.throws(() => new StepVerifier(dir), /no ed25519 public key/);
    writeFileSync(join(dir, "bad.pem"), "not a key");
    assert.throws(() => new StepVerifier(dir), /step verify key .*bad.pem/);
  });
});

describe("argument validation", () => {
  const validate = compileArgsSchema("t.x", {
    type: "object",
    properties: { to: { type: "array", items: { type: "string", format: "email" } }, text: { type: "string" } },
    required: ["text"],
    additionalProperties: false,
  });

  it("names the field like the Go executors", () => {
    assert.equal(checkArgs(validate, { text: "hi", to: ["a@example.com"] }), undefined);
    assert.equal(checkArgs(validate, { text: "hi", to: ["a", 5] })?.field, "args.to[1]");
    assert.equal(checkArgs(validate, {})?.field, "args.text");
    assert.equal(checkArgs(validate, { text: 5 })?.field, "args.text");
    assert.equal(checkArgs(validate, { text: "x", cc: "y" })?.field, "args.cc");
  });

  it("refuses an invalid schema naming the tool", () => {
    assert.throws(() => compileArgsSchema("t.bad", { type: "nope" }), /tool t.bad: argsSchema/);
  });
});
