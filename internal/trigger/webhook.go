package trigger

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Webhook signature headers.
const (
	HeaderGitHub = "X-Hub-Signature-256"
	HeaderStripe = "Stripe-Signature"
)

// DefaultTolerance is how old a Stripe signature's timestamp may be when
// the trigger sets none.
const DefaultTolerance = 5 * time.Minute

// Signature errors. They are logged server-side; the caller only ever
// sees 401 without the reason.
var (
	ErrSignatureMissing = errors.New("signature header missing")
	ErrSignatureInvalid = errors.New("signature does not match")
	ErrSignatureStale   = errors.New("signature timestamp outside the tolerance")
)

// Verify checks a webhook request's signature of body with secret under
// scheme (SchemeGitHub or SchemeStripe), in constant time. For Stripe,
// the signed timestamp must be within tolerance of now (0:
// DefaultTolerance), which bounds replays to that window.
func Verify(scheme string, secret []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	if len(secret) == 0 {
		return errors.New("no secret")
	}
	switch scheme {
	case SchemeGitHub:
		v := h.Get(HeaderGitHub)
		if v == "" {
			return ErrSignatureMissing
		}
		hexSig, ok := strings.CutPrefix(v, "sha256=")
		if !ok {
			return ErrSignatureInvalid
		}
		got, err := hex.DecodeString(hexSig)
		if err != nil {
			return ErrSignatureInvalid
		}
		if !hmac.Equal(got, mac(secret, body)) {
			return ErrSignatureInvalid
		}
		return nil
	case SchemeStripe:
		v := h.Get(HeaderStripe)
		if v == "" {
			return ErrSignatureMissing
		}
		var ts string
		var sigs [][]byte
		for _, part := range strings.Split(v, ",") {
			k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
			switch k {
			case "t":
				ts = val
			case "v1":
				if b, err := hex.DecodeString(val); err == nil {
					sigs = append(sigs, b)
				}
			}
		}
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || len(sigs) == 0 {
			return ErrSignatureInvalid
		}
		want := mac(secret, []byte(ts+"."+string(body)))
		match := false
		for _, s := range sigs {
			// Every candidate is compared: no early exit on a match.
			match = hmac.Equal(s, want) || match
		}
		if !match {
			return ErrSignatureInvalid
		}
		if tolerance <= 0 {
			tolerance = DefaultTolerance
		}
		if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
			return ErrSignatureStale
		}
		return nil
	}
	return fmt.Errorf("signature scheme %q: want github or stripe", scheme)
}

func mac(secret, msg []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(msg)
	return m.Sum(nil)
}

// SignGitHub is the X-Hub-Signature-256 value of body (for clients and
// tests).
func SignGitHub(secret, body []byte) string {
	return "sha256=" + hex.EncodeToString(mac(secret, body))
}

// SignStripe is the Stripe-Signature value of body at t (for clients and
// tests).
func SignStripe(secret, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, []byte(ts+"."+string(body))))
}

// ReplayID identifies a signed webhook delivery: the same request sent
// again has the same id (the event stream's deduplication drops it), a
// new delivery has another. GitHub: X-GitHub-Delivery when present, else
// the signature; Stripe: the signature header (it signs the timestamp).
func ReplayID(scheme string, h http.Header) string {
	var v string
	switch scheme {
	case SchemeGitHub:
		v = h.Get("X-GitHub-Delivery")
		if v == "" {
			v = h.Get(HeaderGitHub)
		}
	case SchemeStripe:
		v = h.Get(HeaderStripe)
	}
	sum := sha256.Sum256([]byte(scheme + "\x00" + v))
	return hex.EncodeToString(sum[:16])
}
