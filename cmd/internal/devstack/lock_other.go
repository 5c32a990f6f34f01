//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package devstack

import "os"

// tryLock is a no-op where flock is not available: the data directory is
// not protected against a second process there.
func tryLock(*os.File) (bool, error) { return true, nil }

func unlock(*os.File) error { return nil }
