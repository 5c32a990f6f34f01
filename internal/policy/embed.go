package policy

import _ "embed"

// DefaultYAML is the default policy (builtin:default): side-effecting tools
// need approval, mail only to allowed domains, sql.exec always needs
// approval, plans with confidence below 0.6 need approval.
//
//go:embed default.yaml
var DefaultYAML []byte
