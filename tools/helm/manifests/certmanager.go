package manifests

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Certificate is the part of cert-manager's cert-manager.io/v1
// Certificate that planex uses, decoded strictly (the fields follow
// cert-manager 1.x's CertificateSpec).
type Certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName string `json:"secretName"`
		CommonName string `json:"commonName,omitempty"`
		Subject    *struct {
			OrganizationalUnits []string `json:"organizationalUnits,omitempty"`
		} `json:"subject,omitempty"`
		IsCA        bool     `json:"isCA,omitempty"`
		DNSNames    []string `json:"dnsNames,omitempty"`
		IPAddresses []string `json:"ipAddresses,omitempty"`
		URIs        []string `json:"uris,omitempty"`
		Usages      []string `json:"usages,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		Duration    string `json:"duration,omitempty"`
		RenewBefore string `json:"renewBefore,omitempty"`
		IssuerRef   struct {
			Name  string `json:"name"`
			Kind  string `json:"kind,omitempty"`
			Group string `json:"group,omitempty"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// Issuer is cert-manager's cert-manager.io/v1 Issuer: self-signed (to
// bootstrap a CA) or a CA from a Secret.
type Issuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SelfSigned *struct{} `json:"selfSigned,omitempty"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
}
