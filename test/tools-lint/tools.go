//go:build tools

// Package tools pins the linters of `make lint` (staticcheck). It is a separate module so the main
// module does not depend on honnef.co/go/tools; the Makefile builds the binary into bin/ from here.
package tools

import (
	_ "honnef.co/go/tools/cmd/staticcheck"
)
