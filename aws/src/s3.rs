//! The lake on S3: `s3://BUCKET[/PREFIX]`, through object_store's S3 store.
//!
//! Configured like every AWS client of fovea ([`crate::config`]: region and
//! the credential chain with profiles, SSO, ECS task roles and instance profiles,
//! `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` for a stand-in, reached with
//! plain HTTP only on loopback). Opening probes the bucket, so a missing
//! bucket, denied access or a wrong region is an error naming the URL
//! before anything else happens.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::prefix::PrefixStore;

use fovea_core::{Error, Result};

/// Bucket and prefix of an `s3://` URL.
pub fn parse_s3_url(url: &str) -> Result<(String, String)> {
    let bad = |why: &str| Error::WrongState(format!("lake {url}: {why} (expected s3://BUCKET or s3://BUCKET/PREFIX)"));
    let rest = url.strip_prefix("s3://").ok_or_else(|| bad("not an s3:// URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket"));
    }
    Ok((bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

/// The object store of the lake at `url` (`s3://BUCKET[/PREFIX]`), checked
/// to be reachable.
pub fn s3_store(url: &str) -> Result<Arc<dyn ObjectStore>> {
    let (bucket, prefix) = parse_s3_url(url)?;
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(&bucket);
    let endpoint = builder
        .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
        .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
    if let Some(e) = &endpoint {
        builder = builder.with_endpoint(e.clone());
        if crate::is_loopback(e) {
            builder = builder.with_allow_http(true);
        }
    }
    // Credentials and region from the one AWS configuration (profiles, SSO,
    // web identity, ECS, IMDS), as every other client of fovea has them.
    let sdk = crate::config::sdk_config()?;
    if let Some(chain) = sdk.credentials_provider() {
        builder = builder.with_credentials(Arc::new(crate::config::SdkCredentials::new(chain)));
    }
    if builder.get_config_value(&AmazonS3ConfigKey::Region).is_none()
        && let Some(region) = sdk.region()
    {
        builder = builder.with_region(region.as_ref());
    }
    let s3 = builder.build().map_err(|e| store_error(url, "configure", &e))?;
    let store: Arc<dyn ObjectStore> =
        if prefix.is_empty() { Arc::new(s3) } else { Arc::new(PrefixStore::new(s3, Path::from(prefix.as_str()))) };
    // A list of one page: fails now, naming the URL, if the bucket is
    // missing, access is denied or the region is wrong.
    let probe = Arc::clone(&store);
    fovea_core::lake::block_on_io(async move { probe.list_with_delimiter(None).await.map(|_| ()) })?
        .map_err(|e| store_error(url, "open", &e))?;
    Ok(store)
}

fn store_error(url: &str, what: &str, e: &object_store::Error) -> Error {
    Error::Backend { backend: "S3", operation: what.into(), key: url.into(), message: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_a_prefix() {
        assert_eq!(parse_s3_url("s3://b").unwrap(), ("b".into(), String::new()));
        assert_eq!(parse_s3_url("s3://b/lakes/one/").unwrap(), ("b".into(), "lakes/one".into()));
        assert!(parse_s3_url("s3:///x").is_err());
        assert!(parse_s3_url("/tmp/lake").is_err());
        assert!(crate::is_loopback("http://127.0.0.1:5000"));
        assert!(crate::is_loopback("http://localhost:5000"));
        assert!(crate::is_loopback("http://[::1]:5000"));
        assert!(!crate::is_loopback("https://s3.eu-west-1.amazonaws.com"));
    }
}
