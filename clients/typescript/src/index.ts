/**
 * @planex/client: the TypeScript client of planex's public gRPC API
 * (planex.v1.SupervisorService). See README.md; the executor SDK is
 * "@planex/client/executor".
 */
export {
  createClient,
  isTerminal,
  runResult,
  terminalStatuses,
  PlanexClient,
  type CallOptions,
  type ClientOptions,
  type Decision,
  type DecideInit,
  type Pem,
  type TlsOptions,
  type WatchOptions,
} from "./client.js";
export {
  Code,
  InvalidArgument,
  NotFound,
  PermissionDenied,
  PlanexError,
  Unauthenticated,
  Unavailable,
  toPlanexError,
  type ErrorCodeName,
} from "./errors.js";
export * from "./gen/planex/v1/run_pb.js";
export * from "./gen/planex/v1/plan_pb.js";
export * from "./gen/planex/v1/supervisor_pb.js";
