package bus

import "net/url"

// redactURL hides credentials in a NATS URL before it is logged or
// returned in an error.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	u.User = url.User("REDACTED")
	return u.String()
}
