//! The lake named on the command line: `--lake DIR|s3://BUCKET/PREFIX`
//! with `--state dynamodb://TABLE` (required for an `s3://` lake; a local
//! lake keeps its state in SQLite files under `DIR/_fovea` by default).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fovea_aws::dynamo::DynamoState;
use fovea_core::EngineConfig;
use fovea_core::location::{LakeBackends, OpenLake, OpenMode, OpenReader};
use fovea_core::metered::StoreMeter;

use crate::replay::CliResult;

/// `--functions`: who runs combine's and storage GC's rewrites for a
/// replayer.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct FunctionsArgs {
    /// Run combine and storage GC's rewrites in the Lambda functions
    /// PREFIX-combine and PREFIX-gc: lambda://PREFIX[?concurrency=N&timeout_s=S]
    /// (the lake must be on S3; AWS_ENDPOINT_URL_LAMBDA for a local
    /// endpoint). Default: in this process.
    #[arg(long, env = "FOVEA_FUNCTIONS")]
    pub functions: Option<String>,
}

impl FunctionsArgs {
    /// Has `engine` (of the lake `lake`) hand its rewrites to the functions
    /// named, if any.
    pub fn attach(&self, lake: &LakeArgs, engine: &fovea_core::Engine) -> CliResult<()> {
        let Some(url) = &self.functions else { return Ok(()) };
        if lake.dir().is_some() {
            return Err(format!(
                "--functions {url}: Lambda functions read and write the lake on S3, and --lake {} is a local directory",
                lake.lake
            )
            .into());
        }
        let target = fovea_aws::functions::FunctionsTarget::parse(url)?;
        tracing::info!(combine = %target.combine, gc = %target.gc, concurrency = target.concurrency, "rewrites run in Lambda functions");
        engine.set_rewrite_worker(Arc::new(fovea_aws::functions::LambdaRewrites::new(target, &lake.lake)?));
        Ok(())
    }
}

/// `--iceberg`: publish every checkpoint as Iceberg tables (by default).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct IcebergArgs {
    /// Publish every checkpoint as one Iceberg snapshot per table, under
    /// LAKE/iceberg/SCHEMA/TABLE (file metadata: any Iceberg reader opens a
    /// table by that path): v2 (position delete files: every reader,
    /// Athena included), v3 (deletion vectors: Spark with Iceberg 1.8+,
    /// Trino, DuckDB, Snowflake) or off. Default: v2, and a table published
    /// in v3 already stays in v3.
    #[arg(long, value_name = "FORMAT", value_parser = IcebergPublishing::parse)]
    pub iceberg: Option<IcebergPublishing>,
    /// Also register the published tables in a catalog after every
    /// publication: glue://DATABASE (the AWS Glue Data Catalog, where
    /// Athena finds tables; the database must exist). The Glue table of
    /// `schema.table` is `schema_table`.
    #[arg(long, value_name = "CATALOG")]
    pub iceberg_catalog: Option<String>,
    /// Publish at most once per this many seconds (default 0: every
    /// checkpoint; the last checkpoint before a stop always is). Each
    /// publication writes a few objects per changed table — on S3 most of
    /// a replayer's requests at low rates (`fovea-bench cost`) — and
    /// Iceberg readers see data up to this much older. At most 300: half
    /// of how long replaced files stay for readers of a snapshot.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = parse_publish_secs)]
    pub iceberg_secs: f64,
}

/// `--iceberg-secs`: seconds in 0..=300.
fn parse_publish_secs(s: &str) -> Result<f64, String> {
    let most = fovea_iceberg::DEFAULT_RETENTION.as_secs_f64() / 2.0;
    s.parse::<f64>().ok().filter(|v| (0.0..=most).contains(v)).ok_or_else(|| {
        format!(
            "--iceberg-secs {s}: expected seconds from 0 to {most} (half the {} s files stay for readers)",
            most * 2.0
        )
    })
}

/// What `--iceberg` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcebergPublishing {
    /// Publish in this format.
    Format(fovea_iceberg::FormatVersion),
    /// Do not publish.
    Off,
}

impl IcebergPublishing {
    /// Parses `v2`, `v3` (or `2`, `3`) or `off`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            other => fovea_iceberg::FormatVersion::parse(other).map(Self::Format).map_err(|_| {
                format!("--iceberg {other}: expected v2 (position deletes), v3 (deletion vectors) or off")
            }),
        }
    }
}

impl IcebergArgs {
    /// Publishing in `format` (as `--iceberg FORMAT` asks).
    pub fn format(format: fovea_iceberg::FormatVersion) -> Self {
        IcebergArgs { iceberg: Some(IcebergPublishing::Format(format)), ..IcebergArgs::default() }
    }

    /// Not publishing (as `--iceberg off` asks).
    pub fn off() -> Self {
        IcebergArgs { iceberg: Some(IcebergPublishing::Off), ..IcebergArgs::default() }
    }

    /// Whether `--iceberg off` was given.
    pub fn is_off(&self) -> bool {
        self.iceberg == Some(IcebergPublishing::Off)
    }

    /// Refuses options that contradict each other, before anything opens.
    pub fn check(&self) -> CliResult<()> {
        match &self.iceberg_catalog {
            Some(catalog) if self.is_off() => {
                Err(format!("--iceberg-catalog {catalog}: nothing is published with --iceberg off").into())
            }
            _ if self.is_off() && self.iceberg_secs > 0.0 => {
                Err(format!("--iceberg-secs {}: nothing is published with --iceberg off", self.iceberg_secs).into())
            }
            _ => Ok(()),
        }
    }

    /// How often at most a checkpoint is published (`--iceberg-secs`).
    pub fn publish_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.iceberg_secs)
    }

    /// How long the engine keeps lake files no checkpoint names for
    /// readers of published snapshots: the publication retention when
    /// publishing, none otherwise (also across a restart: see
    /// [`fovea_core::EngineConfig::retire_grace`]).
    pub fn retire_grace(&self) -> std::time::Duration {
        if self.is_off() { std::time::Duration::ZERO } else { fovea_iceberg::DEFAULT_RETENTION }
    }

    /// The publisher `--iceberg` asks for, over the lake of `engine`; the
    /// engine then keeps the files combine and storage GC replace for as
    /// long as published metadata may name them
    /// ([`fovea_iceberg::DEFAULT_RETENTION`]), and the publisher keeps the
    /// snapshots the lake's registered readers read.
    pub fn publisher(
        &self,
        lake: &LakeArgs,
        engine: &fovea_core::Engine,
    ) -> CliResult<Option<Arc<fovea_iceberg::Publisher>>> {
        self.check()?;
        let format = match self.iceberg {
            Some(IcebergPublishing::Off) => return Ok(None),
            Some(IcebergPublishing::Format(f)) => Some(f),
            None => None,
        };
        let publisher =
            iceberg_publisher(lake, Arc::clone(engine.lake().store()), format, self.iceberg_catalog.as_deref())?
                .with_readers(Arc::clone(engine.clock().store()));
        engine.set_retire_grace(self.retire_grace());
        Ok(Some(Arc::new(publisher)))
    }
}

/// A publisher of the lake `lake` (its `store`) in `format` (`None`, the
/// default: v2, and a table published in v3 already stays in v3),
/// registering the tables in `catalog` (`glue://DATABASE`) when given.
pub fn iceberg_publisher(
    lake: &LakeArgs,
    store: Arc<dyn object_store::ObjectStore>,
    format: Option<fovea_iceberg::FormatVersion>,
    catalog: Option<&str>,
) -> CliResult<fovea_iceberg::Publisher> {
    let chosen = format.unwrap_or(fovea_iceberg::FormatVersion::V2);
    let mut publisher = fovea_iceberg::Publisher::new(store, &lake.root_uri()?, chosen);
    if format.is_none() {
        publisher = publisher.keeping_newer_formats();
    }
    match catalog {
        None => Ok(publisher),
        Some(url) if url.starts_with("glue://") => {
            let glue = fovea_aws::glue::GlueRegistry::open(url)?;
            Ok(publisher.with_registry(Arc::new(glue)))
        }
        Some(other) => Err(format!("--iceberg-catalog {other}: expected glue://DATABASE").into()),
    }
}

/// `--lake`, `--state` and `--no-create`, as every lake command takes them.
#[derive(clap::Args, Clone, Debug)]
pub struct LakeArgs {
    /// The lake: a directory, or s3://BUCKET/PREFIX.
    #[arg(long)]
    pub lake: String,
    /// Where the lake's timestamps, lease and catalog live:
    /// dynamodb://TABLE (required for an s3:// lake; a local lake keeps
    /// them in SQLite files in its _fovea folder by default).
    #[arg(long, env = "FOVEA_STATE")]
    pub state: Option<String>,
    /// Fail instead of creating a missing DynamoDB state table.
    #[arg(long)]
    pub no_create: bool,
}

impl LakeArgs {
    /// A local lake directory with its embedded state.
    pub fn local(dir: &Path) -> Self {
        LakeArgs { lake: dir.display().to_string(), state: None, no_create: false }
    }

    /// The lake's directory, when it is local.
    pub fn dir(&self) -> Option<PathBuf> {
        self.address().dir()
    }

    /// The lake's root as an absolute URI (`file:///DIR` or the s3:// URL),
    /// as open table formats name its files.
    pub fn root_uri(&self) -> CliResult<String> {
        match self.dir() {
            Some(dir) => {
                std::fs::create_dir_all(&dir)?;
                let abs = std::fs::canonicalize(&dir).map_err(|e| format!("--lake {}: {e}", self.lake))?;
                Ok(format!("file://{}", abs.display()))
            }
            None => Ok(self.lake.trim_end_matches('/').to_owned()),
        }
    }

    /// The lake's backends.
    pub fn backends(&self) -> CliResult<LakeBackends> {
        Ok(self.backends_metered(None)?.0)
    }

    /// Where the lake and its state are.
    pub fn address(&self) -> fovea_aws::lake::LakeAddress {
        fovea_aws::lake::LakeAddress::new(&self.lake, self.state.clone())
    }

    /// The lake's backends, its object store counted in `meter`, and the
    /// DynamoDB state when it has one (to count its writes). With
    /// `FOVEA_FAULTS` set (tests only), faults are injected into all three
    /// backends ([`LakeBackends::with_env_faults`]).
    pub fn backends_metered(&self, meter: Option<Arc<StoreMeter>>) -> CliResult<(LakeBackends, Option<DynamoState>)> {
        let (backends, dynamo) = self.address().backends(!self.no_create, meter)?;
        Ok((backends.with_env_faults()?, dynamo))
    }

    /// Opens the lake as its one writer (waiting for its lease).
    pub fn open_write(&self, config: EngineConfig, lease: Duration) -> CliResult<OpenLake> {
        open_write(self.backends()?, config, lease)
    }

    /// Opens an existing lake for reading as of its newest checkpoint,
    /// beside a possibly running replayer, without its engine: a local
    /// folder that is not a lake is an error (nothing is created).
    pub fn open_read(&self) -> CliResult<OpenReader> {
        Ok(fovea_core::location::open_reader(self.existing_lake()?, fovea_core::lease::DEFAULT_LEASE_TTL)?)
    }

    /// The catalog of an existing lake (nothing else is opened).
    pub fn open_catalog(&self) -> CliResult<Arc<dyn fovea_core::catalog::Catalog>> {
        Ok(self.existing_lake()?.catalog)
    }

    /// The backends of an existing lake: a local folder that is not a lake
    /// is an error.
    pub(crate) fn existing_lake(&self) -> CliResult<LakeBackends> {
        Ok(self.address().existing()?.with_env_faults()?)
    }
}

/// Opens the lake of `backends` as its one writer (waiting for its lease).
pub fn open_write(backends: LakeBackends, config: EngineConfig, lease: Duration) -> CliResult<OpenLake> {
    Ok(fovea_core::location::open(backends, config, OpenMode::Write, lease)?)
}
