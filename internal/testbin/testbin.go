// Package testbin gives tests that run planex as a separate process the
// binary to run: $PLANEX_BINARY when set (CI builds the release binary
// once and points every such test at it), else one built from the
// repository with the release's build settings (CGO_ENABLED=0, -trimpath),
// so that a test build and `make binary-linux` share the build cache.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// EnvBinary names the variable holding a prebuilt planex binary.
const EnvBinary = "PLANEX_BINARY"

// Planex returns $PLANEX_BINARY (made absolute) or builds ./cmd/planex of
// the module rooted at root into dir and returns its path.
func Planex(root, dir string) (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", fmt.Errorf("%s: %w", EnvBinary, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("%s: %w", EnvBinary, err)
		}
		return abs, nil
	}
	out := filepath.Join(dir, "planex")
	return out, Build(root, "./cmd/planex", out)
}

// Build compiles pkg (a package path or ./relative to root) into out with
// the release's build settings.
func Build(root, pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}
