import type { JsonObject, JsonValue } from "@bufbuild/protobuf";

import { ErrorCode } from "../gen/planex/v1/plan_pb.js";

/** What running a tool does to the world (ToolSpec.side_effect). */
export type SideEffectName = "read" | "write" | "external";

/** What a tool's run function is given besides its arguments. */
export interface ToolContext {
  /** Run id. */
  runId: string;
  /** Step id. */
  stepId: string;
  /** Attempt number (1-based); with run and step it identifies the attempt. */
  attempt: number;
  /** Plan revision of the step. */
  planRevision: number;
  /** This replica's id (the result's executor_id). */
  executorId: string;
  /** Aborted when the step's timeout or deadline passes or the executor stops; stop work then. */
  signal: AbortSignal;
  /** When the attempt must be done (timeout and deadline combined). */
  deadline: Date;
  /** W3C trace context of the step request, to pass on to what the tool calls. */
  traceparent?: string;
}

/**
 * ToolDefinition is one tool of a pool: its spec (registered in
 * planex-tools, what planners see) and the function that runs it. run
 * returns the output (any JSON value) or throws: a {@link ToolError} for a
 * classified failure, any other Error for TOOL_FAILED with its message
 * (keep secrets out of it).
 */
export interface ToolDefinition<Args extends JsonObject = JsonObject> {
  /** "<pool>.<verb>", both matching ^[a-z][a-z0-9_]*$. */
  name: string;
  /** What the tool does and returns, for people and planners. */
  description: string;
  /** JSON Schema (2020-12) of the arguments; validated before run is called. */
  argsSchema?: JsonObject;
  /** JSON Schema of the output. */
  outputSchema?: JsonObject;
  /** read, write or external (default external). Non-read tools get effect records. */
  sideEffect?: SideEffectName;
  /** Running the same arguments twice has the effect of running them once. */
  idempotent?: boolean;
  /** Steps of this tool wait for a human decision; requests must carry an approval proof. */
  requiresApproval?: boolean;
  /** Dotted argument or output fields redacted in logs, traces and events. */
  sensitiveFields?: string[];
  /** Version of the implementation, for audit. */
  version?: string;
  /** Timeout when the step sets none (default: the executor's, 60 s). */
  defaultTimeoutMs?: number;
  /** Longest silence between heartbeats the supervisor allows for a running attempt (0: none). */
  heartbeatTimeoutMs?: number;
  /** Runs the tool. */
  run(args: Args, ctx: ToolContext): Promise<JsonValue | undefined> | JsonValue | undefined;
}

/** defineTool returns its argument, typed: a helper for editors. */
export function defineTool<Args extends JsonObject = JsonObject>(def: ToolDefinition<Args>): ToolDefinition<Args> {
  return def;
}

/**
 * ToolError is a classified tool failure. retryable marks failures where
 * nothing happened and the same attempt may succeed later (a backend is
 * down): the step is redelivered with backoff, and fails UNAVAILABLE
 * after the pool's maximum deliveries.
 */
export class ToolError extends Error {
  /** The StepError code. */
  readonly code: ErrorCode;
  /** The offending argument field ("args.to[1]"), when one is to blame. */
  readonly field?: string;
  /** The same attempt may succeed later. */
  readonly retryable: boolean;

  constructor(code: ErrorCode, message: string, options: { field?: string; retryable?: boolean; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.name = "ToolError";
    this.code = code;
    this.field = options.field;
    this.retryable = options.retryable ?? false;
  }

  /** The tool ran and reported an error (TOOL_FAILED). */
  static failed(message: string): ToolError {
    return new ToolError(ErrorCode.TOOL_FAILED, message);
  }

  /** A backend is unavailable and nothing happened yet (UNAVAILABLE, retryable). */
  static unavailable(message: string, cause?: unknown): ToolError {
    return new ToolError(ErrorCode.UNAVAILABLE, message, { retryable: true, cause });
  }

  /** The arguments are wrong in a way the schema cannot say (INVALID_ARGUMENT). */
  static invalidArgument(field: string, message: string): ToolError {
    return new ToolError(ErrorCode.INVALID_ARGUMENT, message, { field });
  }

  /** A policy of the tool forbids the action (PERMISSION_DENIED). */
  static permissionDenied(message: string): ToolError {
    return new ToolError(ErrorCode.PERMISSION_DENIED, message);
  }

  /** The tool may have acted and does not know whether it did (OUTCOME_UNKNOWN). */
  static outcomeUnknown(message: string): ToolError {
    return new ToolError(ErrorCode.OUTCOME_UNKNOWN, message);
  }
}
