package chaos

import "testing"

// TestUpgradeBuildPrevious only builds the previous release's planex
// where TestUpgrade looks for it (buildPrevious), so that TestUpgrade
// finds it cached: .ci/build-previous runs it, in CI's background checks.
// Skipped without -upgrade (or PLANEX_UPGRADE=1), as TestUpgrade is.
func TestUpgradeBuildPrevious(t *testing.T) {
	if !upgradeEnabled() {
		t.Skip("build of the previous release for the upgrade test: run with `go test ./test/chaos -run '^TestUpgradeBuildPrevious$' -upgrade -v` (or bash .ci/build-previous)")
	}
	tag, commit := previousRelease(t)
	buildPrevious(t, tag, commit)
}
