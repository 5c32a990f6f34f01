package authn

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
)

// APIKeyPrefix starts every key GenerateAPIKey makes, so that secret
// scanners and the redaction patterns recognise leaked keys.
const APIKeyPrefix = "pxk_"

// GenerateAPIKey returns a new random API key and the line to add to an
// API key file for it.
func GenerateAPIKey(name string, roles ...Role) (key, line string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("generate API key: %w", err)
	}
	key = APIKeyPrefix + base64.RawURLEncoding.EncodeToString(b)
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = r.String()
	}
	return key, fmt.Sprintf("%s %s %s", HashAPIKey(key), name, strings.Join(names, ",")), nil
}

// HashAPIKey is the form an API key is stored in: "sha256:<hex>". Keys are
// 256-bit random strings, so an unsalted hash is not open to guessing.
func HashAPIKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// APIKeys authenticates bearer API keys against a file of lines
//
//	sha256:<hex of the key's SHA-256> <name> <role>[,<role>...]
//
// ('#' starts a comment). The file is re-read when it changes, so keys are
// added and revoked without a restart; a file that no longer parses keeps
// the previous keys and the error is returned by Reload.
type APIKeys struct {
	path string

	mu    sync.Mutex
	stamp string
	keys  []apiKey
}

type apiKey struct {
	hash   [32]byte
	name   string
	roles  []Role
	tenant string // "" unless the line names one
}

// NewAPIKeys loads the key file.
func NewAPIKeys(path string) (*APIKeys, error) {
	k := &APIKeys{path: path}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload re-reads the file when it changed.
func (k *APIKeys) Reload() error {
	stamp := statStamp(k.path)
	k.mu.Lock()
	defer k.mu.Unlock()
	if stamp == k.stamp && k.keys != nil {
		return nil
	}
	data, err := os.ReadFile(k.path)
	if err != nil {
		return fmt.Errorf("read API key file: %w", err)
	}
	keys, err := parseAPIKeys(data)
	if err != nil {
		return fmt.Errorf("API key file %s: %w", k.path, err)
	}
	k.keys, k.stamp = keys, stamp
	return nil
}

func parseAPIKeys(data []byte) ([]apiKey, error) {
	keys := []apiKey{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 && len(f) != 4 {
			return nil, fmt.Errorf("line %d: want \"sha256:<hex> <name> <roles> [tenant=<tenant>]\"", n)
		}
		tenant := ""
		if len(f) == 4 {
			t, ok := strings.CutPrefix(f[3], "tenant=")
			if !ok || ValidTenant(t) != nil {
				return nil, fmt.Errorf("line %d: tenant: want tenant=<name> (lower-case letters, digits and '-', starting with a letter, at most 31)", n)
			}
			tenant = t
		}
		hexHash, ok := strings.CutPrefix(f[0], "sha256:")
		raw, err := hex.DecodeString(hexHash)
		if !ok || err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("line %d: hash: want sha256:<64 hex digits> (never the key itself)", n)
		}
		var roles []Role
		for _, name := range strings.Split(f[2], ",") {
			r, err := ParseRole(name)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			roles = append(roles, r)
		}
		var h [32]byte
		copy(h[:], raw)
		keys = append(keys, apiKey{hash: h, name: f[1], roles: roles, tenant: tenant})
	}
	return keys, sc.Err()
}

// errUnknownKey is returned for a key not in the file.
var errUnknownKey = errors.New("unknown API key")

// Authenticate returns the identity of key.
func (k *APIKeys) Authenticate(key string) (Identity, error) {
	_ = k.Reload() // a broken file keeps the previous keys
	sum := sha256.Sum256([]byte(key))
	k.mu.Lock()
	defer k.mu.Unlock()
	var found *apiKey
	for i := range k.keys {
		if subtle.ConstantTimeCompare(sum[:], k.keys[i].hash[:]) == 1 {
			found = &k.keys[i]
		}
	}
	if found == nil {
		return Identity{}, errUnknownKey
	}
	return Identity{Subject: SubjectAPIKey + found.name, Roles: found.roles, Method: MethodAPIKey, Tenant: found.tenant}, nil
}

func statStamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "missing"
	}
	return fmt.Sprintf("%d:%d", fi.Size(), fi.ModTime().UnixNano())
}
