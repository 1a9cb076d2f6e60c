// Package examples embeds the example platform so that `meridian up` runs
// on a fresh clone with no files to point at.
package examples

import (
	"embed"
	"io/fs"
)

//go:embed platform
var platform embed.FS

// Platform is the example platform's configuration (deploy/examples/platform).
func Platform() fs.FS {
	sub, err := fs.Sub(platform, "platform")
	if err != nil {
		panic(err) // the embedded tree always has the folder
	}
	return sub
}
