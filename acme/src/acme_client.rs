//! The ACME side of issuance: the HTTP client trusting the policy's roots, the account (loaded
//! from or saved to the store), and certificate keys with their CSRs.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use instant_acme::{
    Account, AccountCredentials, BodyWrapper, ExternalAccountKey, HttpClient, NewAccount,
};
use ployz_core::{CertificateKeyType, CertificatePolicy};
use ployz_store::certificates::{account_key, StoredAccount};
use ployz_store::Store;
use rustls::pki_types::CertificateDer;

/// How long connecting to the directory may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the authority says the account we used does not exist (it was deactivated, or the
/// authority lost its state): the stored credentials are useless and a new account is made.
pub(crate) fn is_account_missing(e: &instant_acme::Error) -> bool {
    matches!(e, instant_acme::Error::Api(p)
        if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:accountDoesNotExist"))
}

/// The HTTP client for the policy's directory: rustls with ring, trusting the policy's CA bundle
/// when it has one and the platform's roots otherwise.
pub(crate) fn http_client(policy: &CertificatePolicy) -> Result<Box<dyn HttpClient>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let bundle = policy.ca_bundle_der().map_err(|e| e.to_string())?;
    let builder = if bundle.is_empty() {
        hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_platform_verifier(provider)
            .map_err(|e| format!("the platform's certificate verifier is unusable: {e}"))?
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for (i, der) in bundle.into_iter().enumerate() {
            roots
                .add(CertificateDer::from(der))
                .map_err(|e| format!("ca_bundle_pem certificate {} is not usable: {e}", i + 1))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let connector = builder.https_or_http().enable_http1().wrap_connector(http);
    let client: HyperClient<_, BodyWrapper<Bytes>> =
        HyperClient::builder(TokioExecutor::new()).build(connector);
    Ok(Box::new(client))
}

/// What an account in memory was made for: a change of any of these means another account.
#[derive(Clone, PartialEq, Eq)]
struct AccountFor {
    directory_url: String,
    ca_bundle_pem: Option<String>,
    eab_key_id: Option<String>,
}

/// The ACME account in use, kept in memory and in the store.
#[derive(Default)]
pub(crate) struct Accounts {
    current: Option<(AccountFor, Account)>,
}

impl std::fmt::Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounts")
            .field("loaded", &self.current.is_some())
            .finish()
    }
}

impl Accounts {
    /// The account for `policy`: the one in memory, else the one in the store, else a new one
    /// registered with the authority (bound to the policy's external account, if any) and saved
    /// to the store.
    pub(crate) async fn account(
        &mut self,
        store: &Store,
        policy: &CertificatePolicy,
    ) -> Result<Account, String> {
        let eab = policy
            .external_account_binding()
            .map_err(|e| e.to_string())?;
        let wanted = AccountFor {
            directory_url: policy.directory_url().to_owned(),
            ca_bundle_pem: policy.ca_bundle_pem.clone(),
            eab_key_id: eab.as_ref().map(|e| e.key_id.clone()),
        };
        if let Some((made_for, account)) = &self.current {
            if *made_for == wanted {
                return Ok(account.clone());
            }
        }
        let key = account_key(&wanted.directory_url);
        let stored: Option<StoredAccount> = store
            .get(&key)
            .map_err(|e| format!("reading the ACME account failed: {e}"))?
            .and_then(|r| r.live_value().map(<[u8]>::to_vec))
            .and_then(|v| serde_json::from_slice(&v).ok())
            .filter(|s: &StoredAccount| {
                s.directory_url == wanted.directory_url && s.eab_key_id == wanted.eab_key_id
            });
        let loaded = match stored {
            Some(s) => match serde_json::from_value::<AccountCredentials>(s.credentials) {
                Ok(creds) => Some(
                    Account::builder_with_http(http_client(policy)?)
                        .from_credentials(creds)
                        .await
                        .map_err(|e| {
                            format!(
                                "the ACME directory {} cannot be used: {}",
                                wanted.directory_url,
                                ployz_core::error_chain(&e)
                            )
                        })?,
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "stored ACME account credentials do not decode; registering a new account");
                    None
                }
            },
            None => None,
        };
        let account = match loaded {
            Some(a) => a,
            None => {
                let eab_key = eab
                    .as_ref()
                    .map(|e| ExternalAccountKey::new(e.key_id.clone(), &e.hmac_key));
                let (account, creds) = Account::builder_with_http(http_client(policy)?)
                    .create(
                        &NewAccount {
                            contact: &[],
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        wanted.directory_url.clone(),
                        eab_key.as_ref(),
                    )
                    .await
                    .map_err(|e| {
                        format!(
                            "registering an ACME account at {} failed: {}",
                            wanted.directory_url,
                            ployz_core::error_chain(&e)
                        )
                    })?;
                let record = StoredAccount {
                    directory_url: wanted.directory_url.clone(),
                    eab_key_id: wanted.eab_key_id.clone(),
                    credentials: serde_json::to_value(&creds)
                        .map_err(|e| format!("ACME account credentials do not serialise: {e}"))?,
                };
                let value = serde_json::to_vec(&record).expect("an account record serialises");
                crate::issuer::blocking(|| store.put(&key, value))
                    .map_err(|e| format!("saving the ACME account failed: {e}"))?;
                tracing::info!(directory = %wanted.directory_url, "registered an ACME account");
                account
            }
        };
        self.current = Some((wanted, account.clone()));
        Ok(account)
    }

    /// Forgets the account (in memory and in the store) after the authority said it does not
    /// exist; the next [`Accounts::account`] registers a new one.
    pub(crate) fn forget(&mut self, store: &Store, policy: &CertificatePolicy) {
        self.current = None;
        if let Err(e) = store.delete(&account_key(policy.directory_url())) {
            tracing::warn!(error = %e, "forgetting the ACME account failed");
        }
    }
}

/// A new private key of `key_type` (PKCS#8 PEM) and a CSR (DER) for `hostname` signed by it.
/// CPU-bound (an RSA key takes a while): call it off the async threads.
pub(crate) fn key_and_csr(
    hostname: &str,
    key_type: CertificateKeyType,
) -> Result<(String, Vec<u8>), String> {
    let key = match key_type {
        CertificateKeyType::EcdsaP256 => {
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .map_err(|e| format!("generating an ECDSA P-256 key failed: {e}"))?
        }
        CertificateKeyType::Rsa2048 => {
            use rsa::pkcs8::EncodePrivateKey;
            let rsa_key = rsa::RsaPrivateKey::new(&mut rand::rngs::OsRng, 2048)
                .map_err(|e| format!("generating an RSA-2048 key failed: {e}"))?;
            let der = rsa_key
                .to_pkcs8_der()
                .map_err(|e| format!("encoding the RSA key failed: {e}"))?;
            let pkcs8 = rustls::pki_types::PrivatePkcs8KeyDer::from(der.as_bytes());
            rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &rcgen::PKCS_RSA_SHA256)
                .map_err(|e| format!("loading the RSA key failed: {e}"))?
        }
    };
    let mut params = rcgen::CertificateParams::new(vec![hostname.to_owned()])
        .map_err(|e| format!("'{hostname}' cannot go in a CSR: {e}"))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .map_err(|e| format!("signing the CSR failed: {e}"))?;
    Ok((key.serialize_pem(), csr.der().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer;

    #[test]
    fn ecdsa_keys_and_csrs_name_the_hostname() {
        let (key_pem, csr) = key_and_csr("app.test", CertificateKeyType::EcdsaP256).unwrap();
        assert!(key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let (_, req) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&csr).unwrap();
        let names: Vec<String> = req
            .requested_extensions()
            .into_iter()
            .flatten()
            .filter_map(|e| match e {
                x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) => Some(
                    san.general_names
                        .iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(names, ["DNSName(app.test)"]);
    }

    #[test]
    fn rsa_keys_are_2048_bits() {
        let (key_pem, csr) = key_and_csr("app.test", CertificateKeyType::Rsa2048).unwrap();
        assert!(key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let (_, req) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&csr).unwrap();
        let spki = &req.certification_request_info.subject_pki;
        match spki.parsed().unwrap() {
            x509_parser::public_key::PublicKey::RSA(rsa) => assert_eq!(rsa.key_size(), 2048),
            other => panic!("not RSA: {other:?}"),
        }
    }

    #[test]
    fn account_missing_is_recognised() {
        let p: instant_acme::Problem = serde_json::from_value(serde_json::json!({
            "type": "urn:ietf:params:acme:error:accountDoesNotExist",
            "detail": "no account",
            "status": 400
        }))
        .unwrap();
        assert!(is_account_missing(&instant_acme::Error::Api(p)));
        let p: instant_acme::Problem = serde_json::from_value(serde_json::json!({
            "type": "urn:ietf:params:acme:error:rateLimited",
        }))
        .unwrap();
        assert!(!is_account_missing(&instant_acme::Error::Api(p)));
        // An external account binding refused is not a missing account.
        let p: instant_acme::Problem = serde_json::from_value(serde_json::json!({
            "type": "urn:ietf:params:acme:error:unauthorized",
            "detail": "external account binding JWS verification error",
        }))
        .unwrap();
        assert!(!is_account_missing(&instant_acme::Error::Api(p)));
    }
}
