package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// normalizeTgz rewrites the gzipped tar file so that its bytes depend only
// on its entries' names, modes and contents: every entry's time becomes
// epoch, owners 0:0 without names, the gzip header keeps its name, comment
// and extra field (Helm's) but no time. `helm package` stamps each entry
// with the packaging time; the chart inside is unchanged.
func normalizeTgz(file string, epoch int64) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Name, zw.Comment, zw.Extra, zw.OS = zr.Name, zr.Comment, zr.Extra, zr.OS
	tr := tar.NewReader(zr)
	tw := tar.NewWriter(zw)
	mtime := time.Unix(epoch, 0).UTC()
	entries := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir:
		default:
			return fmt.Errorf("%s: %s is neither a file nor a directory", file, h.Name)
		}
		n := &tar.Header{
			Typeflag: h.Typeflag,
			Name:     h.Name,
			Mode:     h.Mode,
			Size:     h.Size,
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		if len(h.Name) <= 100 {
			n.Format = tar.FormatUSTAR
		}
		if err := tw.WriteHeader(n); err != nil {
			return fmt.Errorf("%s: %s: %w", file, h.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("%s: %s: %w", file, h.Name, err)
		}
		entries++
	}
	if entries == 0 {
		return fmt.Errorf("%s: empty archive", file)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return writeFileAtomic(file, buf.Bytes())
}
