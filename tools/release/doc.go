// Package release pins the tools `make release` runs, in their own module
// so that their dependency trees never enter planex's go.mod:
//
//   - cyclonedx-gomod writes the release's CycloneDX SBOM from the Go
//     modules compiled into cmd/planex:
//     go tool -modfile=tools/release/go.mod cyclonedx-gomod app ...
//
// scripts/release.sh runs them; docs/releases.md describes the release.
package release
