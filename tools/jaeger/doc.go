// Package jaeger pins the Jaeger v2 all-in-one binary used by planex's
// end-to-end trace tests. It lives in its own module so Jaeger's large
// dependency tree never enters planex's own go.mod. Build it with:
//
//	go build -C tools/jaeger -o "$BIN" github.com/jaegertracing/jaeger/cmd/jaeger
package jaeger
