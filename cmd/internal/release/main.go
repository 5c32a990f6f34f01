// Command release is the Go half of `make release` (scripts/release.sh)
// and scripts/verify-release.sh: the steps that need exact control over
// bytes, which shell tools do not give reproducibly, and the checks of a
// finished release directory.
//
//	release pack-image  --layout DIR --out FILE --mtime EPOCH
//	    tars an OCI image layout (what `podman manifest push oci:DIR`
//	    wrote) with fixed names, order, modes, owners and times, and prints
//	    the digest of its image index: the digest the registry will serve.
//	release normalize-tgz --mtime EPOCH FILE
//	    rewrites a gzipped tar (the chart `helm package` wrote, whose
//	    entries carry the packaging time) with every time set to EPOCH.
//	release record --dir DIR --version V --commit C --mtime EPOCH --repository R
//	    writes DIR/release.json: the artefacts, their checksums and the
//	    image's digests.
//	release verify DIR
//	    checks a release directory (see verify.go).
//
// Only the standard library: it runs in the root module with `go run`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// errUsage is returned for a missing or unknown subcommand.
var errUsage = errors.New("usage: release pack-image|normalize-tgz|record|verify ... (see cmd/internal/release/main.go)")

func run(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if len(args) == 0 {
		return errUsage
	}
	fs := flag.NewFlagSet("release "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	switch args[0] {
	case "pack-image":
		layout := fs.String("layout", "", "OCI image layout directory")
		out := fs.String("out", "", "archive to write")
		mtime := fs.String("mtime", "", "time of every entry (Unix seconds, SOURCE_DATE_EPOCH)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		epoch, err := parseEpoch(*mtime)
		if err != nil {
			return err
		}
		if *layout == "" || *out == "" {
			return errors.New("pack-image: --layout and --out are required")
		}
		digest, err := packImage(*layout, *out, epoch)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, digest)
		return err
	case "normalize-tgz":
		mtime := fs.String("mtime", "", "time of every entry (Unix seconds, SOURCE_DATE_EPOCH)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		epoch, err := parseEpoch(*mtime)
		if err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return errors.New("normalize-tgz: want exactly one file")
		}
		return normalizeTgz(fs.Arg(0), epoch)
	case "record":
		var r recordOptions
		var mtime string
		fs.StringVar(&r.Dir, "dir", "", "release directory")
		fs.StringVar(&r.Version, "version", "", "release version (vX.Y.Z)")
		fs.StringVar(&r.Commit, "commit", "", "commit the release is built from")
		fs.StringVar(&r.Repository, "repository", "", "image repository the release is pushed to")
		fs.StringVar(&mtime, "mtime", "", "SOURCE_DATE_EPOCH of the build (the commit's time)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		epoch, err := parseEpoch(mtime)
		if err != nil {
			return err
		}
		r.SourceDateEpoch = epoch
		return record(r)
	case "verify":
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return errors.New("verify: want exactly one release directory")
		}
		return verify(ctx, fs.Arg(0), stdout)
	}
	return fmt.Errorf("unknown subcommand %q: %w", args[0], errUsage)
}

// parseEpoch reads a SOURCE_DATE_EPOCH value.
func parseEpoch(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("--mtime is required (SOURCE_DATE_EPOCH: the commit's time in Unix seconds)")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--mtime %q: want Unix seconds", s)
	}
	return n, nil
}
