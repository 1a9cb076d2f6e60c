// Package arch holds the test that checks docs/architecture.md against the
// code: its package map lists exactly the packages `go list ./...` finds,
// and no import breaks the rules it states. It also checks that the
// README's test command runs, without the race detector, every test that
// skips or shrinks under it. It has no code of its own.
package arch
