package emailpool

// SetBeforeClaim installs a hook that email.send runs between reading a
// draft and claiming it, to line racing replicas up in tests.
func SetBeforeClaim(p *Pool, f func(id string)) { p.beforeClaim = f }
