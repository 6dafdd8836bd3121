// Package tokenclient is the proxy side of the token protocol: one local
// token bucket per resource group, fed by batched grants from rgserver;
// pre-charge before a statement is forwarded and post-charge after its final
// packet; degraded mode when no grant arrives; and the gRPC Store of groups
// and user bindings, cached from the settings stream (rpc Watch).
package tokenclient
