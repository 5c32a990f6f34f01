/**
 * @planex/client/executor: an SDK for planex executor pools in
 * TypeScript. It speaks the protocol of docs/executor-protocol.md over
 * NATS JetStream (nats.js): the pool's durable consumer, signed step
 * requests, effect records, started notices and heartbeats, results.
 *
 *     import { serve, defineTool } from "@planex/client/executor";
 *     await serve({
 *       pool: "tsdemo",
 *       nats: { servers: "nats://127.0.0.1:4222", nkeySeedFile },
 *       verifyKeys: "/path/to/step-verify",
 *       tools: [defineTool({ name: "tsdemo.greet", description: "…", sideEffect: "read",
 *         argsSchema: { type: "object", properties: { name: { type: "string" } }, required: ["name"] },
 *         run: ({ name }) => ({ greeting: `Hello, ${name}!` }) })],
 *     });
 */
export {
  Defaults,
  Executor,
  Names,
  connectionOptions,
  newReplicaId,
  serve,
  type ExecutorOptions,
  type NatsOptions,
  type StepOutcome,
} from "./executor.js";
export { jsonLogger, type LogAttrs, type LogLevel, type Logger } from "./log.js";
export { ToolError, defineTool, type SideEffectName, type ToolContext, type ToolDefinition } from "./tool.js";
export {
  Headers,
  MAX_VALIDITY_MS,
  ReplayCacheUnavailable,
  StepRefused,
  StepVerifier,
  keyIdOf,
  signedBytes,
  type RefusalReason,
  type SharedReplays,
  type VerifyRequest,
} from "./verify.js";
export { ErrorCode, SideEffect } from "../gen/planex/v1/plan_pb.js";
export * from "../gen/planex/v1/executor_pb.js";
