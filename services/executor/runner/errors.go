package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Error is a structured tool failure. Tools return it (or wrap it) to give
// the step result a code, the offending field and a message that is safe to
// show to a client; any other error is reported as an internal failure with
// a generic message and logged in full.
type Error struct {
	// Code classifies the failure.
	Code planexv1.ErrorCode
	// Field is the offending argument path ("args.sql"), when one is to blame.
	Field string
	// Message is shown to clients and planners; it must not hold secrets.
	Message string
	// Retryable reports that running the same attempt again may succeed and
	// that the tool has had no effect yet: the runner redelivers the step
	// (NakWithDelay) until the pool's maximum deliveries.
	Retryable bool
	// Err is the cause, logged but never shown.
	Err error
}

// Error renders "<field>: <message>", or the message alone when it has
// no field or already starts with it.
func (e *Error) Error() string {
	if e.Field != "" && !strings.HasPrefix(e.Message, e.Field+":") {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// StepError converts e to its wire form.
func (e *Error) StepError() *planexv1.StepError {
	return &planexv1.StepError{Code: e.Code, Message: e.Error(), Retryable: e.Retryable, Field: e.Field}
}

// InvalidArgument is a bad argument: field names it ("args.max_rows") and
// the message says what is wrong with which value.
func InvalidArgument(field, format string, a ...any) *Error {
	return &Error{Code: planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Field: field, Message: fmt.Sprintf(format, a...)}
}

// PermissionDenied is an action a policy forbids (a write through a
// read-only tool, a recipient outside the allowlist).
func PermissionDenied(field, format string, a ...any) *Error {
	return &Error{Code: planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED, Field: field, Message: fmt.Sprintf(format, a...)}
}

// Failed is an error the tool's backend reported (an SQL error); cause is
// logged.
func Failed(cause error, format string, a ...any) *Error {
	return &Error{Code: planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED, Message: fmt.Sprintf(format, a...), Err: cause}
}

// Unavailable is a backend that cannot be reached; the step is retried.
// Return it only when the tool has had no effect.
func Unavailable(cause error, format string, a ...any) *Error {
	return &Error{Code: planexv1.ErrorCode_ERROR_CODE_UNAVAILABLE, Message: fmt.Sprintf(format, a...), Retryable: true, Err: cause}
}

// OutcomeUnknown is a side effect that may or may not have happened (the
// connection broke after the mail was handed over); the step is escalated,
// never repeated.
func OutcomeUnknown(cause error, format string, a ...any) *Error {
	return &Error{Code: planexv1.ErrorCode_ERROR_CODE_OUTCOME_UNKNOWN, Message: fmt.Sprintf(format, a...), Err: cause}
}

// toError classifies any error a tool returned.
func toError(ctx context.Context, tool string, err error) *Error {
	var te *Error
	switch {
	case errors.As(err, &te):
		return te
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &Error{Code: planexv1.ErrorCode_ERROR_CODE_TIMEOUT, Message: fmt.Sprintf("%s did not finish within the step timeout", tool), Err: err}
	case errors.Is(err, context.Canceled):
		return &Error{Code: planexv1.ErrorCode_ERROR_CODE_CANCELLED, Message: fmt.Sprintf("%s was cancelled", tool), Err: err}
	default:
		return &Error{Code: planexv1.ErrorCode_ERROR_CODE_INTERNAL, Message: fmt.Sprintf("internal error in %s", tool), Err: err}
	}
}
