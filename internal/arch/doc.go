// Package arch holds the test that checks docs/architecture.md against the
// code: its package map lists exactly the packages `go list ./...` finds,
// and no import breaks the rules it states. It has no code of its own.
package arch
