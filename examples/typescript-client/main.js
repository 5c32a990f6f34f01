// Start a planex run and follow it to the end with @planex/client:
// every event as it is appended, approving each gate it waits at when
// --approve is given (otherwise `planex runs approve RUN_ID` decides).
//
// Against a `planex dev` on this machine (its credentials directory is
// printed at start; ~/.cache/planex/dev/credentials by default):
//
//   npm install
//   node main.js --addr 127.0.0.1:7400 --credentials ~/.cache/planex/dev/credentials \
//     --approve "Close support ticket 400"
//
// Elsewhere: --token-file (or PLANEX_TOKEN), --ca-file, and --cert-file
// with --key-file for mTLS; --plaintext for a supervisor without TLS.
import { join } from "node:path";
import { parseArgs } from "node:util";

import { NotFound, PlanexError, RunStatus, Unauthenticated, createClient, runResult } from "@planex/client";

const { values: flags, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    addr: { type: "string", default: process.env.PLANEX_ADDR ?? "127.0.0.1:7400" },
    credentials: { type: "string" },
    "token-file": { type: "string" },
    "ca-file": { type: "string" },
    "cert-file": { type: "string" },
    "key-file": { type: "string" },
    plaintext: { type: "boolean", default: false },
    approve: { type: "boolean", default: false },
  },
});
const goal = positionals.join(" ") || "How many open support tickets does Acme Corp have?";
const creds = flags.credentials;

const planex = createClient({
  address: flags.addr,
  token: flags["token-file"] || creds ? undefined : process.env.PLANEX_TOKEN,
  tokenFile: flags["token-file"] ?? (creds ? join(creds, "cli.token") : undefined),
  plaintext: flags.plaintext,
  tls: {
    caFile: flags["ca-file"] ?? (creds ? join(creds, "ca.pem") : undefined),
    certFile: flags["cert-file"],
    keyFile: flags["key-file"],
  },
});

try {
  const { run } = await planex.startRun({ goal, labels: { example: "typescript-client" } });
  console.log(`run ${run.id}: ${goal}`);
  for await (const ev of planex.watchRun(run.id)) {
    console.log(`  #${ev.sequence} ${ev.payload.case}`);
    if (ev.payload.case === "gateOpened" && flags.approve) {
      const gate = ev.payload.value.gate;
      await planex.decide({ runId: run.id, gateId: gate.id, decision: "approve", actor: "typescript-client example" });
      console.log(`  approved gate ${gate.id} (${gate.reason})`);
    }
  }
  const done = await planex.getRun(run.id);
  console.log(`${RunStatus[done.status]}: ${done.result !== undefined ? JSON.stringify(runResult(done)) : done.stopMessage}`);
  process.exitCode = done.status === RunStatus.SUCCEEDED ? 0 : 1;
} catch (err) {
  if (err instanceof Unauthenticated) console.error(`not signed in: ${err.rawMessage} (--token-file or PLANEX_TOKEN)`);
  else if (err instanceof NotFound) console.error(`not found: ${err.rawMessage}`);
  else if (err instanceof PlanexError) console.error(`${err.codeName}${err.field ? ` (${err.field})` : ""}: ${err.rawMessage}`);
  else console.error(err);
  process.exitCode = 2;
} finally {
  planex.close();
}
