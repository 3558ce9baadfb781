package relay

// The conductor protocol as an executor speaks it, with no socket in it: a frame in, the reply frame out.
//
// Relay speaks first and the executor only answers: every request carries "type" and "request_id", and its reply
// carries the same two, the fields of that type, and "error_message" (null when all went well). The field names are
// those of the conductor client built into dbos-transact-golang v1.6.0 (and dbos 3.2.0), so Relay reads this
// client's replies as it reads theirs.
//
// How a request can fail, and what the reply then says:
//
//   - the frame is not a JSON object, or lacks "type" or "request_id": an error reply with whatever could be read
//     (Relay logs a reply it cannot match; nothing here panics);
//   - a required field is missing or of the wrong type: "error_message" names it (v1.6.0 dropped the request);
//   - the operation failed: "error_message" holds the context and the error (only the error's kind in
//     metadata-only mode);
//   - the SDK release cannot do it (ErrUnsupported): "error_message" says so and "unsupported" is true, which Relay
//     answers with a 501 naming the operation, not a 502 that blames the executor;
//   - an unknown "type": "Unknown message type", as every SDK answers it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
)

// UnknownType is the error_message every SDK answers a request of an unknown type with.
const UnknownType = "Unknown message type"

// dataTypes are the requests that move an application's data rather than its metadata: refused in metadata-only
// mode, as v1.6.0 refuses them (Relay answers the refusal with a 409).
var dataTypes = map[string]bool{
	"get_workflow_events": true, "get_workflow_notifications": true, "get_workflow_streams": true,
	"export_workflow": true, "import_workflow": true,
}

// BadRequest is a request this client cannot act on: a required field missing or of the wrong type.
type BadRequest struct{ Message string }

func (e *BadRequest) Error() string { return e.Message }

// Unsupported is an operation this SDK release cannot do through its public API (it moved out of the MIT-licensed
// module): the reply says so with "unsupported": true.
type Unsupported struct{ Message string }

func (e *Unsupported) Error() string { return e.Message }

// Fields are the fields of a reply, beside "type", "request_id" and "error_message".
type Fields map[string]any

// Request is one request from Relay: its type, request_id and every field as sent.
type Request struct {
	Kind      string // its "type"
	RequestID string
	fields    map[string]any
}

func (r Request) bad(format string, args ...any) error {
	return &BadRequest{Message: r.Kind + " request: " + fmt.Sprintf(format, args...)}
}

// has reports whether the field is present and not null.
func (r Request) has(name string) bool { return r.fields[name] != nil }

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// Str is a required string field.
func (r Request) Str(name string) (string, error) {
	v := r.fields[name]
	if v == nil {
		return "", r.bad("field '%s' is required", name)
	}
	s, ok := v.(string)
	if !ok {
		return "", r.bad("field '%s' must be a string, not %s", name, jsonKind(v))
	}
	return s, nil
}

// OptStr is an optional string field: "" when absent or null.
func (r Request) OptStr(name string) (string, error) {
	if !r.has(name) {
		return "", nil
	}
	return r.Str(name)
}

// OptInt is an optional integer field: nil when absent or null.
func (r Request) OptInt(name string) (*int64, error) {
	v := r.fields[name]
	if v == nil {
		return nil, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return nil, r.bad("field '%s' must be an integer, not %s", name, jsonKind(v))
	}
	i, err := n.Int64()
	if err != nil {
		return nil, r.bad("field '%s' must be an integer, not %s", name, n.String())
	}
	return &i, nil
}

// Int is a required integer field.
func (r Request) Int(name string) (int64, error) {
	if !r.has(name) {
		return 0, r.bad("field '%s' is required", name)
	}
	i, err := r.OptInt(name)
	if err != nil {
		return 0, err
	}
	return *i, nil
}

// OptBool is an optional boolean field: nil when absent or null.
func (r Request) OptBool(name string) (*bool, error) {
	v := r.fields[name]
	if v == nil {
		return nil, nil
	}
	b, ok := v.(bool)
	if !ok {
		return nil, r.bad("field '%s' must be a boolean, not %s", name, jsonKind(v))
	}
	return &b, nil
}

// Bool is an optional boolean field with a default.
func (r Request) Bool(name string, fallback bool) (bool, error) {
	b, err := r.OptBool(name)
	if err != nil || b == nil {
		return fallback, err
	}
	return *b, nil
}

// Strs is an optional list of strings: nil when absent or null.
func (r Request) Strs(name string) ([]string, error) {
	v := r.fields[name]
	if v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, r.bad("field '%s' must be a list, not %s", name, jsonKind(v))
	}
	out := make([]string, len(list))
	for i, item := range list {
		s, ok := item.(string)
		if !ok {
			return nil, r.bad("field '%s' must be a list of strings", name)
		}
		out[i] = s
	}
	return out, nil
}

// StrOrList is an optional filter given as one string or a list of them (the conductor's StringOrList).
func (r Request) StrOrList(name string) ([]string, error) {
	switch v := r.fields[name].(type) {
	case nil:
		return nil, nil
	case string:
		return []string{v}, nil
	case []any:
		return r.Strs(name)
	default:
		return nil, r.bad("field '%s' must be a string or a list, not %s", name, jsonKind(v))
	}
}

// Object is an optional JSON object: nil when absent or null.
func (r Request) Object(name string) (map[string]any, error) {
	v := r.fields[name]
	if v == nil {
		return nil, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, r.bad("field '%s' must be an object, not %s", name, jsonKind(v))
	}
	return m, nil
}

// OptTime is an optional ISO 8601 instant (RFC 3339; one without a zone is UTC): the zero time when absent.
func (r Request) OptTime(name string) (time.Time, error) {
	s, err := r.OptStr(name)
	if err != nil || s == "" {
		return time.Time{}, err
	}
	t, err := parseTime(s)
	if err != nil {
		return time.Time{}, r.bad("field '%s' must be an ISO 8601 time, not %q", name, s)
	}
	return t, nil
}

func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.ParseInLocation("2006-01-02T15:04:05.999999999", s, time.UTC)
}

// Body is the request's "body" object as a Request of the same type, so its fields are read the same way.
func (r Request) Body(required bool) (Request, error) {
	v := r.fields["body"]
	if v == nil && !required {
		return Request{Kind: r.Kind, RequestID: r.RequestID, fields: map[string]any{}}, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return Request{}, r.bad("field 'body' must be an object")
	}
	return Request{Kind: r.Kind, RequestID: r.RequestID, fields: m}, nil
}

// Handler answers one request with the reply's fields.
type Handler func(Request) (Fields, error)

// Operation is how one request type is answered: Handler returns the reply's fields; Failed are the fields of a
// reply whose request failed ("success": false, an empty list, ...), as v1.6.0 and dbos 3.2.0 send them.
type Operation struct {
	Handler Handler
	Failed  Fields
	Context string // what an error message says was being done
}

// Decode reads the request in a frame; a *BadRequest (with whatever type and request_id could be read) when it is
// not one.
func Decode(frame []byte) (Request, error) {
	decoder := json.NewDecoder(bytes.NewReader(frame))
	decoder.UseNumber()
	var data any
	if err := decoder.Decode(&data); err != nil {
		return Request{}, &BadRequest{Message: "malformed message: not JSON"}
	}
	if decoder.More() {
		return Request{}, &BadRequest{Message: "malformed message: not JSON (data after the value)"}
	}
	object, ok := data.(map[string]any)
	if !ok {
		return Request{}, &BadRequest{Message: "malformed message: not a JSON object"}
	}
	kind, kindOK := object["type"].(string)
	requestID, idOK := object["request_id"].(string)
	request := Request{Kind: kind, RequestID: requestID, fields: object}
	if !kindOK || !idOK {
		return request, &BadRequest{Message: "malformed message: 'type' and 'request_id' must be strings"}
	}
	return request, nil
}

// Encode is one reply frame.
func Encode(kind, requestID string, fields Fields, errorMessage *string, unsupported bool) []byte {
	reply := make(map[string]any, len(fields)+4)
	for name, value := range fields {
		reply[name] = value
	}
	reply["type"], reply["request_id"], reply["error_message"] = kind, requestID, errorMessage
	if unsupported {
		reply["unsupported"] = true
	}
	data, err := json.Marshal(reply)
	if err != nil { // a value JSON has no form for: the reply says so rather than vanishing
		text := "cannot encode the reply: " + err.Error()
		data, _ = json.Marshal(map[string]any{"type": kind, "request_id": requestID, "error_message": text})
	}
	return data
}

func text(s string) *string { return &s }

// Handle is the reply to one frame. It never panics: whatever went wrong is in the reply's error_message.
func Handle(frame []byte, operations map[string]Operation, metadataOnly bool, log *slog.Logger) []byte {
	request, err := Decode(frame)
	if err != nil {
		log.Warn("relay-dbos: " + err.Error())
		return Encode(request.Kind, request.RequestID, Fields{}, text(err.Error()), false)
	}
	operation, ok := operations[request.Kind]
	if !ok {
		log.Warn("relay-dbos: unexpected message type", "type", truncate(request.Kind, 40))
		return Encode(request.Kind, request.RequestID, Fields{}, text(UnknownType), false)
	}
	if metadataOnly && dataTypes[request.Kind] {
		return Encode(request.Kind, request.RequestID, operation.Failed,
			text(request.Kind+" is not allowed in conductor metadata-only mode"), false)
	}
	fields, err := call(operation.Handler, request)
	if err == nil {
		return Encode(request.Kind, request.RequestID, fields, nil, false)
	}
	var bad *BadRequest
	var unsupported *Unsupported
	switch {
	case errors.As(err, &bad):
		log.Warn("relay-dbos: " + bad.Message)
		return Encode(request.Kind, request.RequestID, operation.Failed, text(bad.Message), false)
	case errors.As(err, &unsupported):
		return Encode(request.Kind, request.RequestID, operation.Failed, text(unsupported.Message), true)
	}
	log.Error("relay-dbos: "+operation.Context, "error", err)
	message := operation.Context + ": " + err.Error()
	if metadataOnly {
		message = operation.Context + ": " + errorKind(err) + " (details withheld in metadata-only mode)"
	}
	return Encode(request.Kind, request.RequestID, operation.Failed, &message, false)
}

// call runs a handler; a panic in it (an alert handler's, say) is its error.
func call(handler Handler, request Request) (fields Fields, err error) {
	defer func() {
		if recovered := recover(); recovered != nil {
			fields, err = nil, fmt.Errorf("panic: %v", recovered)
		}
	}()
	return handler(request)
}

// errorKind names an error without its details: DBOS's error code, else the innermost error's type.
func errorKind(err error) string {
	var dbosErr *dbos.Error
	if errors.As(err, &dbosErr) {
		return dbosErr.Code.String()
	}
	for next := errors.Unwrap(err); next != nil; next = errors.Unwrap(err) {
		err = next
	}
	return fmt.Sprintf("%T", err)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
