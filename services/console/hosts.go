package console

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// allowedHost is a name the console answers to; port "" accepts any port.
// A name "*.example.com" matches one label in its place.
type allowedHost struct{ name, port string }

// parseAllowedHost parses an --allowed-hosts entry: a host name or IP
// address, optionally with ":port" (IPv6 in brackets).
func parseAllowedHost(s string) (allowedHost, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return allowedHost{}, errors.New("empty host")
	}
	if strings.ContainsAny(s, "/?#@ ") {
		return allowedHost{}, errors.New("want a host name or host:port, not a URL")
	}
	name, port := splitHost(s)
	if name == "" {
		return allowedHost{}, errors.New("empty host")
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return allowedHost{}, fmt.Errorf("port %q: want 1-65535", port)
		}
	}
	return allowedHost{name: name, port: port}, nil
}

// splitHost splits a Host header value (or an --allowed-hosts entry) into
// its lower-case name, without brackets or a trailing dot, and its port.
func splitHost(hostport string) (name, port string) {
	name = hostport
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		name, port = h, p
	} else if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
		name = name[1 : len(name)-1]
	}
	return strings.TrimSuffix(strings.ToLower(name), "."), port
}

// hostGuard refuses requests that do not come to one of the console's own
// names (DNS rebinding: a web page whose name was re-pointed at 127.0.0.1
// is same-origin with itself, not with the console, and its requests
// carry its own name as Host), and state-changing requests a browser sends
// from another origin.
type hostGuard struct {
	allowed     []allowedHost
	defaultPort string // of the console's scheme, for a Host without a port
	logger      *slog.Logger
}

// newHostGuard allows the loopback names, the --http-addr host (unless it
// is unspecified, "0.0.0.0" or "::"), the names of the HTTPS certificate
// and cfg.AllowedHosts.
func newHostGuard(cfg Config, logger *slog.Logger) (*hostGuard, error) {
	g := &hostGuard{defaultPort: "80", logger: logger}
	for _, n := range []string{"localhost", "127.0.0.1", "::1"} {
		g.allowed = append(g.allowed, allowedHost{name: n})
	}
	if h, _, err := net.SplitHostPort(cfg.HTTPAddr); err == nil && h != "" {
		if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
			name, _ := splitHost(h)
			g.allowed = append(g.allowed, allowedHost{name: name})
		}
	}
	if cfg.TLSCertFile != "" {
		g.defaultPort = "443"
		names, err := certNames(cfg.TLSCertFile)
		if err != nil {
			return nil, fmt.Errorf("--http-tls-cert-file: %w", err)
		}
		for _, n := range names {
			g.allowed = append(g.allowed, allowedHost{name: n})
		}
	}
	for _, s := range cfg.AllowedHosts {
		a, err := parseAllowedHost(s)
		if err != nil {
			return nil, fmt.Errorf("--allowed-hosts %q: %w", s, err)
		}
		g.allowed = append(g.allowed, a)
	}
	return g, nil
}

// certNames are the DNS names and IP addresses of the first certificate
// in file.
func certNames(file string) ([]string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range c.DNSNames {
		names = append(names, strings.TrimSuffix(strings.ToLower(n), "."))
	}
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	return names, nil
}

// hostAllowed reports whether hostport (a Host header) names the console.
func (g *hostGuard) hostAllowed(hostport string) bool {
	name, port := splitHost(hostport)
	if name == "" {
		return false
	}
	if port == "" {
		port = g.defaultPort
	}
	if ip := net.ParseIP(name); ip != nil {
		name = ip.String() // one spelling of an IPv6 address
	}
	for _, a := range g.allowed {
		if a.port != "" && a.port != port {
			continue
		}
		if a.name == name {
			return true
		}
		if rest, ok := strings.CutPrefix(a.name, "*."); ok {
			if label, tail, ok := strings.Cut(name, "."); ok && label != "" && tail == rest {
				return true
			}
		}
	}
	return false
}

// safeMethod reports whether m changes nothing (Connect's unary GETs and
// the page and its assets).
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// crossOrigin returns why r, a state-changing request, comes from another
// origin than the console's, or "" when it does not. Browsers send Origin
// with every POST; a request without Origin and Sec-Fetch-Site does not
// come from a browser (CLI, curl, the Connect Go client) and cannot be a
// web page's.
func crossOrigin(r *http.Request) string {
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Sprintf("origin %q is not the console's", origin)
		}
		return ""
	}
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
		return ""
	default:
		return fmt.Sprintf("Sec-Fetch-Site %q", site)
	}
}

// wrap answers 403 to a request for another Host, and to a state-changing
// request from another origin, before next sees it.
func (g *hostGuard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.hostAllowed(r.Host) {
			g.logger.Warn("console: request for a host it does not serve refused", "host", r.Host, "method", r.Method, "path", r.URL.Path)
			http.Error(w, fmt.Sprintf("console: Host %q is not one of the console's names (add it to --allowed-hosts)", r.Host), http.StatusForbidden)
			return
		}
		if !safeMethod(r.Method) {
			if why := crossOrigin(r); why != "" {
				g.logger.Warn("console: cross-origin request refused", "why", why, "method", r.Method, "path", r.URL.Path)
				http.Error(w, "console: cross-origin request refused: "+why, http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
