package authn

import (
	"net/http"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// AuthenticateHTTP identifies the caller of an HTTP request exactly as
// Authenticate identifies a gRPC caller: a bearer token (API key or JWT)
// in the Authorization header when one is sent (it must then be valid),
// else a client certificate verified by the TLS handshake.
func (a *Authenticator) AuthenticateHTTP(r *http.Request) (Identity, error) {
	ctx := r.Context()
	if vals := r.Header.Values("Authorization"); len(vals) > 0 {
		ctx = metadata.NewIncomingContext(ctx, metadata.MD{"authorization": vals})
	}
	if r.TLS != nil {
		ctx = peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{State: *r.TLS}})
	}
	return a.Authenticate(ctx)
}
