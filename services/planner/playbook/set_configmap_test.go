package playbook

import (
	"os"
	"path/filepath"
	"testing"
)

// A ConfigMap volume holds each file in a hidden timestamped directory and
// as a symlink through ..data; the playbook must load once.
func TestLoadConfigMapVolumeLayout(t *testing.T) {
	dir := t.TempDir()
	data, err := DemoFS.ReadFile("demo/open-tickets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ts := filepath.Join(dir, "..2026_11_26_05_00_00.123")
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "open-tickets.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "open-tickets.yaml"), filepath.Join(dir, "open-tickets.yaml")); err != nil {
		t.Fatal(err)
	}
	set, err := Load(Dir(dir))
	if err != nil {
		t.Fatalf("load ConfigMap layout: %v", err)
	}
	if set.Len() != 1 {
		t.Fatalf("loaded %d playbooks, want 1", set.Len())
	}
}
