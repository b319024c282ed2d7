"""The AWS Glue side of replayer/tests/it/iceberg.rs, against the Glue of the
AWS_* environment (a local moto).

usage: glue_catalog.py create-database NAME
       glue_catalog.py read DATABASE OUT TABLE...

`read` looks each Glue table up as Athena does (its metadata_location
parameter), reads it through pyiceberg's GlueCatalog into OUT/glue/N.parquet
(N: the table's position in the arguments) and prints one JSON line per
table: its Glue parameters, location and columns, and the metadata file its
location's version-hint.text names ("current").
"""

import json
import os
import sys

import boto3
import pyarrow.parquet as pq
from pyiceberg.catalog import load_catalog


def glue():
    return boto3.client("glue", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))


def main():
    if sys.argv[1] == "create-database":
        glue().create_database(DatabaseInput={"Name": sys.argv[2]})
        return
    database, out, tables = sys.argv[2], sys.argv[3], sys.argv[4:]
    os.makedirs(os.path.join(out, "glue"), exist_ok=True)
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    keys = {
        "access-key-id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
        "secret-access-key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        "region": os.environ.get("AWS_REGION", "us-east-1"),
    }
    props = {"type": "glue"}
    for service in ("glue", "s3"):
        props.update({f"{service}.{k}": v for k, v in keys.items()})
        if endpoint:
            props[f"{service}.endpoint"] = endpoint
    catalog = load_catalog("glue", **props)
    client = glue()
    s3 = boto3.client("s3", endpoint_url=endpoint)
    for i, name in enumerate(tables):
        table = client.get_table(DatabaseName=database, Name=name)["Table"]
        location = table.get("StorageDescriptor", {}).get("Location", "")
        bucket, _, key = location.removeprefix("s3://").partition("/")
        hint = s3.get_object(Bucket=bucket, Key=key + "/metadata/version-hint.text")["Body"].read().decode().strip()
        rows = catalog.load_table((database, name)).scan().to_arrow()
        pq.write_table(rows, os.path.join(out, "glue", f"{i}.parquet"))
        print(
            json.dumps(
                {
                    "name": name,
                    "parameters": table.get("Parameters", {}),
                    "location": location,
                    "current": f"{location}/metadata/v{hint}.metadata.json",
                    "columns": [c["Name"] for c in table.get("StorageDescriptor", {}).get("Columns", [])],
                }
            )
        )


if __name__ == "__main__":
    main()
