import { Code, ConnectError } from "@connectrpc/connect";

/**
 * The gRPC status codes a planex call can end with, by name
 * ("NotFound", "InvalidArgument", …), as in @connectrpc/connect's Code.
 */
export type ErrorCodeName = keyof typeof Code;

// A field path at the start of a message: "goal", "run_id",
// "labels[\"team\"]", "decisions[1].gate_id", followed by ':', a quoted
// value or a number ("mode 5: want …").
const fieldRE = /^([a-z_][a-z0-9_]*(?:\[[^\]]*\])*(?:\.[a-z_][a-z0-9_]*(?:\[[^\]]*\])*)*)(?=: | "| \d)/;

/**
 * PlanexError is every error a planex call rejects with: the gRPC status
 * code, the server's message (safe to show) and, when the message names
 * the offending request field (an InvalidArgument such as
 * "goal: required"), that field. Subclasses mark the codes callers
 * usually branch on: {@link Unauthenticated}, {@link PermissionDenied},
 * {@link NotFound}, {@link InvalidArgument}, {@link Unavailable}.
 */
export class PlanexError extends Error {
  /** The gRPC status code. */
  readonly code: Code;
  /** The code's name ("NotFound"). */
  readonly codeName: ErrorCodeName;
  /** The request field the server blamed, when its message names one. */
  readonly field?: string;
  /** The server's message without the code prefix. */
  readonly rawMessage: string;

  constructor(code: Code, message: string, options?: { cause?: unknown }) {
    super(`${Code[code]}: ${message}`, options);
    this.name = new.target.name;
    this.code = code;
    this.codeName = Code[code] as ErrorCodeName;
    this.rawMessage = message;
    if (code === Code.InvalidArgument || code === Code.FailedPrecondition) {
      const m = fieldRE.exec(message);
      if (m) this.field = m[1];
    }
  }
}

/** The call carried no valid credentials (missing or wrong API key or certificate). */
export class Unauthenticated extends PlanexError {}
/** The caller is authenticated but its role may not make this call. */
export class PermissionDenied extends PlanexError {}
/** The run (or gate, or other named thing) does not exist. */
export class NotFound extends PlanexError {}
/** The request is invalid; {@link PlanexError.field} names the field when known. */
export class InvalidArgument extends PlanexError {}
/** The supervisor could not be reached or its store is unavailable; retrying may help. */
export class Unavailable extends PlanexError {}

/**
 * toPlanexError turns whatever a Connect call threw into a
 * {@link PlanexError} of the matching subclass; an AbortError caused by
 * the caller's own signal is returned as is.
 */
export function toPlanexError(err: unknown): Error {
  if (err instanceof PlanexError) return err;
  if (err instanceof Error && err.name === "AbortError") return err;
  const ce = ConnectError.from(err);
  const opts = { cause: err };
  switch (ce.code) {
    case Code.Unauthenticated:
      return new Unauthenticated(ce.code, ce.rawMessage, opts);
    case Code.PermissionDenied:
      return new PermissionDenied(ce.code, ce.rawMessage, opts);
    case Code.NotFound:
      return new NotFound(ce.code, ce.rawMessage, opts);
    case Code.InvalidArgument:
      return new InvalidArgument(ce.code, ce.rawMessage, opts);
    case Code.Unavailable:
      return new Unavailable(ce.code, ce.rawMessage, opts);
    default:
      return new PlanexError(ce.code, ce.rawMessage, opts);
  }
}

export { Code };
