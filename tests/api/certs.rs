//! Certificates made fresh for one test with `rcgen`: a CA, and server and client certificates
//! it signs.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tinybroker::server::TlsIdentity;
use tonic::transport::{Certificate, Identity};

/// A certificate authority made for one test.
pub struct Ca {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Leaf {
    /// As a client presents it (mutual TLS).
    pub fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }

    /// As the server serves it.
    pub fn server_identity(&self) -> TlsIdentity {
        TlsIdentity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

impl Ca {
    /// A fresh self-signed CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA certificate, as a client or the server trusts it.
    pub fn certificate(&self) -> Certificate {
        Certificate::from_pem(&self.cert_pem)
    }

    /// A certificate for `names` (the first is also the common name), signed by this CA.
    pub fn issue(&self, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A server certificate valid for `localhost` and `127.0.0.1`.
    pub fn server(&self) -> Leaf {
        self.issue(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate for mutual TLS.
    pub fn client(&self, name: &str) -> Leaf {
        self.issue(&[name], ExtendedKeyUsagePurpose::ClientAuth)
    }
}
