package request

import (
	"encoding/json"
	"errors"
	"net/http"
)

// APIError is an error answered to a caller in OpenAI's JSON shape:
// {"error":{"message":...,"type":...,"param":...,"code":...}}. Both tiers
// answer with it so that the OpenAI SDKs surface the message.
type APIError struct {
	Status  int    // HTTP status
	Type    string // e.g. invalid_request_error, rate_limit_error
	Code    string // machine-readable, e.g. model_not_found
	Message string
	// Param names the request parameter at fault; empty is null.
	Param string
	// RetryAfter, when positive, is sent as the Retry-After header, in
	// whole seconds (rounded up by the caller).
	RetryAfter int
}

func (e *APIError) Error() string { return e.Message }

// Write sends the error. Headers already set on w are kept.
func (e *APIError) Write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", itoa(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	json.NewEncoder(w).Encode(e.Body())
}

// Body is the JSON document of the error.
func (e *APIError) Body() map[string]any {
	var code, param any
	if e.Code != "" {
		code = e.Code
	}
	if e.Param != "" {
		param = e.Param
	}
	return map[string]any{"error": map[string]any{"message": e.Message, "type": e.Type, "param": param, "code": code}}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// Errorf-style constructors for the common answers.

// BadRequest is a 400 invalid_request_error.
func BadRequest(code, msg string) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Message: msg}
}

// NotFound is a 404 invalid_request_error (an unknown model).
func NotFound(code, msg string) *APIError {
	return &APIError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: code, Message: msg}
}

// TooManyRequests is a 429 rate_limit_error with a Retry-After.
func TooManyRequests(code, msg string, retryAfter int) *APIError {
	return &APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: code, Message: msg, RetryAfter: retryAfter}
}

// Unavailable is a 503 server_error.
func Unavailable(code, msg string) *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: code, Message: msg}
}

// BodyError is the answer to a body Read or Parse refused: 413 for one
// over the size limit, 400 otherwise (code missing_model or bad_request;
// a *ParamError keeps its param and code). Both tiers answer body errors
// with it.
func BodyError(err error) *APIError {
	var pe *ParamError
	switch {
	case errors.As(err, &pe):
		return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: pe.Code, Param: pe.Param, Message: pe.Message}
	case errors.Is(err, ErrTooLarge):
		return &APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "body_too_large", Message: err.Error()}
	case errors.Is(err, ErrMissingModel):
		return BadRequest("missing_model", err.Error())
	}
	return BadRequest("bad_request", err.Error())
}
