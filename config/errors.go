package config

import (
	"errors"
	"strings"
)

// FieldError is one problem in one field of one object.
type FieldError struct {
	Origin string // file (with :line for a document after the first) or etcd key
	Object string // Kind/name, when known
	Path   string // field path inside the object, e.g. spec.schedulers[2].weights
	Msg    string
}

func (e FieldError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Origin != "" {
		b.WriteString(e.Origin)
		b.WriteString(": ")
	}
	if e.Object != "" && e.Object != "/" {
		b.WriteString(e.Object)
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in a configuration, reported together.
type Errors []FieldError

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Err returns nil for an empty list, so callers can `return errs.Err()`.
func (es Errors) Err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// ErrConflict is returned by writes whose read revision is no longer
// current: someone else applied a change first.
var ErrConflict = errors.New("config: conflict: the configuration changed since it was read; re-read and apply again")

// AsErrors unwraps err into the validation errors it carries, if any.
func AsErrors(err error) (Errors, bool) {
	var es Errors
	if errors.As(err, &es) {
		return es, true
	}
	return nil, false
}
