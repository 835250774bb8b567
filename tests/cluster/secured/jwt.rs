//! Operator-mode identities made for one test: an operator, accounts it signs and users they
//! sign, as JWTs (`{"typ":"JWT","alg":"ed25519-nkey"}`, claims with a `nats` object of their
//! type, signed with the issuer's nkey), and a user's credentials file as `nsc` writes it.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use nkeys::KeyPair;
use serde_json::{Value, json};

/// `header.claims.signature`, each base64url without padding; the signature is the issuer's
/// over `header.claims`.
fn encode(claims: &Value, issuer: &KeyPair) -> String {
    let header = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let signature = issuer.sign(signed.as_bytes()).expect("sign a JWT");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

fn claims(subject: &KeyPair, issuer: &KeyPair, name: &str, nats: Value) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "jti": format!("{}-{name}-{now}", subject.public_key()),
        "iat": now,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject.public_key(),
        "nats": nats,
    })
}

/// The operator: self-signed.
pub struct Operator {
    key: KeyPair,
    pub jwt: String,
}

/// An account the operator signed.
pub struct Account {
    key: KeyPair,
    pub jwt: String,
}

impl Operator {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::new_operator();
        let jwt = encode(
            &claims(&key, &key, name, json!({"type": "operator", "version": 2})),
            &key,
        );
        Self { key, jwt }
    }

    /// An account without limits, JetStream enabled.
    pub fn account(&self, name: &str) -> Account {
        self.account_with(name, true)
    }

    /// The system account the server needs in operator mode: JetStream disabled.
    pub fn system_account(&self) -> Account {
        self.account_with("SYS", false)
    }

    fn account_with(&self, name: &str, jetstream: bool) -> Account {
        let key = KeyPair::new_account();
        let storage = if jetstream { -1 } else { 0 };
        let limits = json!({
            "subs": -1, "data": -1, "payload": -1,
            "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": storage, "disk_storage": storage, "streams": storage, "consumer": storage,
        });
        let jwt = encode(
            &claims(
                &key,
                &self.key,
                name,
                json!({"type": "account", "version": 2, "limits": limits}),
            ),
            &self.key,
        );
        Account { key, jwt }
    }
}

impl Account {
    /// The account's public key, as the server's resolver names it.
    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// A credentials file's text for a new user of this account, without limits or
    /// permissions of its own.
    pub fn user_creds(&self, name: &str) -> String {
        let key = KeyPair::new_user();
        let jwt = encode(
            &claims(
                &key,
                &self.key,
                name,
                json!({
                    "type": "user", "version": 2,
                    "pub": {}, "sub": {},
                    "subs": -1, "data": -1, "payload": -1,
                }),
            ),
            &self.key,
        );
        let seed = key.seed().expect("a user's seed");
        format!(
            "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\
             NKEYs are sensitive and should be treated as secrets.\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
             *************************************************************\n"
        )
    }
}
