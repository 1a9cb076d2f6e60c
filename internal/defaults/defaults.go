// Package defaults holds how a numeric setting left unset takes its
// default, for the configurations of several packages (priority, tier1,
// tier1/hygiene).
package defaults

// Positive is d when v is zero or negative (a setting left unset), else v.
func Positive[T ~int | ~int64 | ~float64](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}
