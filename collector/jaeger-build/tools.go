//go:build tools

// Package tools pins the Jaeger v2 binary in this module's graph.
package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
