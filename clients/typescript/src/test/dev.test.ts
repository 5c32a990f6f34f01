// One `planex dev` for the client's and the executor's tests (starting
// one costs most of the run): with a NATS identity for the tsdemo pool and
// its playbook.
import { after, before } from "node:test";

import { clientSuite } from "./client.suite.js";
import { executorSuite, playbooksDir } from "./executor.suite.js";
import { startDev, type DevStack } from "./harness.js";

let dev: DevStack | undefined;

before(async () => {
  dev = await startDev(["--pool-identity=tsdemo", `--playbooks=${playbooksDir()}`]);
});

after(async () => {
  await dev?.stop();
});

const stack = () => {
  if (!dev) throw new Error("planex dev did not start");
  return dev;
};
clientSuite(stack);
executorSuite(stack);
