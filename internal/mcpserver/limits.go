package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Limits of one request to the HTTP endpoint. The official SDK still
// accepts JSON-RPC batches from clients of protocol versions before
// 2025-06-18 (and from clients that send no version), without a bound on
// their length: 5,000 tools/list calls in a 279 KB request produced a
// 17.6 MB answer.
const (
	// MaxBatch is the most calls one JSON-RPC batch may hold.
	MaxBatch = 50
	// MaxRequestBytes bounds a request body (a goal is at most 4 KiB and
	// start_run inputs 64 KiB).
	MaxRequestBytes = 1 << 20
	// MaxResponseBytes bounds what one request may answer. A response
	// (to one call of a batch, or to a single call) that would cross it is
	// replaced by a JSON-RPC error for the same id; notifications past it
	// are dropped.
	MaxResponseBytes = 8 << 20
)

// JSON-RPC error codes of the limits.
const (
	codeInvalidRequest = -32600
	codeServerError    = -32000 // implementation-defined server error
)

// limits are the bounds the handler enforces (tests lower them).
type limits struct {
	batch, request, response int
}

var defaultLimits = limits{batch: MaxBatch, request: MaxRequestBytes, response: MaxResponseBytes}

// rpcError is a JSON-RPC error response.
type rpcError struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func errorResponse(id json.RawMessage, code int, msg string) []byte {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	e := rpcError{JSONRPC: "2.0", ID: id}
	e.Error.Code, e.Error.Message = code, msg
	b, _ := json.Marshal(e)
	return b
}

// writeRPCError answers a request the handler refuses before the SDK sees
// it: a JSON-RPC error with a null id (the request may not have one).
func writeRPCError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(errorResponse(nil, code, msg))
}

// checkRequest reads r's body (at most l.request bytes) and refuses a
// body over the limit or a batch of more than l.batch calls; otherwise r's
// body is replaced by what was read, for the SDK.
func (l limits) checkRequest(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodPost || r.Body == nil {
		return true
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(l.request)+1))
	if err != nil {
		writeRPCError(w, http.StatusBadRequest, codeInvalidRequest, "read the request body: "+err.Error())
		return false
	}
	if len(body) > l.request {
		writeRPCError(w, http.StatusRequestEntityTooLarge, codeInvalidRequest, fmt.Sprintf("request body exceeds %d bytes", l.request))
		return false
	}
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
		n, err := countBatch(trimmed)
		switch {
		case err != nil:
			writeRPCError(w, http.StatusBadRequest, codeInvalidRequest, "malformed batch: "+err.Error())
			return false
		case n > l.batch:
			writeRPCError(w, http.StatusBadRequest, codeInvalidRequest, fmt.Sprintf("batch of %d calls exceeds the limit of %d", n, l.batch))
			return false
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return true
}

// countBatch counts the elements of a JSON array without decoding them.
func countBatch(b []byte) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil {
		return 0, err
	}
	n := 0
	for dec.More() {
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return 0, err
		}
		n++
	}
	return n, nil
}

// cappedWriter counts what a request answers. The SDK writes one complete
// server-sent event per Write (or one JSON body): a message that would
// cross the cap is replaced, never cut — a response by a JSON-RPC error
// with its id, a notification by nothing — so the client always reads
// well-formed messages.
type cappedWriter struct {
	http.ResponseWriter
	limit    int
	written  int
	exceeded bool
}

// Unwrap lets http.ResponseController flush the underlying writer.
func (c *cappedWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// Flush implements http.Flusher.
func (c *cappedWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	if !c.exceeded && c.written+len(p) <= c.limit {
		n, err := c.ResponseWriter.Write(p)
		c.written += n
		return n, err
	}
	c.exceeded = true
	msg := fmt.Sprintf("the response exceeds the limit of %d bytes; ask for less (fewer calls in a batch, a smaller page)", c.limit)
	var out []byte
	if data, ok := sseData(p); ok {
		if id := responseID(data); id != nil {
			out = sseEvent(p, errorResponse(id, codeServerError, msg))
		}
	} else {
		out = replaceJSON(p, msg)
	}
	if len(out) > 0 {
		if _, err := c.ResponseWriter.Write(out); err != nil {
			return 0, err
		}
	}
	// The whole message counts as handled: the SDK goes on with the next.
	return len(p), nil
}

// sseData returns the data of a server-sent event ("data: " lines joined).
func sseData(p []byte) ([]byte, bool) {
	if !bytes.HasPrefix(p, []byte("event:")) && !bytes.HasPrefix(p, []byte("id:")) && !bytes.HasPrefix(p, []byte("data:")) {
		return nil, false
	}
	var data [][]byte
	for _, line := range bytes.Split(p, []byte("\n")) {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = append(data, bytes.TrimPrefix(d, []byte(" ")))
		}
	}
	return bytes.Join(data, []byte("\n")), len(data) > 0
}

// sseEvent is the event p with data replaced (its event name and id kept).
func sseEvent(p, data []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(p, []byte("\n")) {
		s := string(line)
		if strings.HasPrefix(s, "event:") || strings.HasPrefix(s, "id:") {
			b.WriteString(s + "\n")
		}
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	return b.Bytes()
}

// responseID is the id of a JSON-RPC response, nil for a notification or
// a request (they have a method).
func responseID(data []byte) json.RawMessage {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(data, &m) != nil || m.Method != "" || len(m.ID) == 0 {
		return nil
	}
	return m.ID
}

// replaceJSON replaces a JSON body (one response or an array of them) by
// errors with the same ids.
func replaceJSON(p []byte, msg string) []byte {
	var arr []json.RawMessage
	if err := json.Unmarshal(p, &arr); err != nil {
		if id := responseID(p); id != nil {
			return errorResponse(id, codeServerError, msg)
		}
		return errorResponse(nil, codeServerError, msg)
	}
	var out []json.RawMessage
	for _, m := range arr {
		if id := responseID(m); id != nil {
			out = append(out, errorResponse(id, codeServerError, msg))
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return errorResponse(nil, codeServerError, msg)
	}
	return b
}
