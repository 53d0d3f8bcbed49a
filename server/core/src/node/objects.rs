//! What the node passes to its backend as it stands: buckets, listings, uploads in
//! progress, an object's metadata and parts. These change no cached copy (writes,
//! deletes and reads are in `write` and `read`).

use super::{Node, NodeError};
use crate::backend::{
    check_key, BucketInfo, ListPage, ListQuery, ObjectMeta, ObjectParts, PartInfo, PartOf,
    PutOptions, UploadInfo,
};

impl Node {
    pub async fn list_buckets(&self) -> Result<Vec<BucketInfo>, NodeError> {
        Ok(self.backend.list_buckets().await?)
    }

    pub async fn create_bucket(&self, bucket: &str) -> Result<(), NodeError> {
        Ok(self.backend.create_bucket(bucket).await?)
    }

    pub async fn head_bucket(&self, bucket: &str) -> Result<(), NodeError> {
        Ok(self.backend.head_bucket(bucket).await?)
    }

    pub async fn delete_bucket(&self, bucket: &str) -> Result<(), NodeError> {
        Ok(self.backend.delete_bucket(bucket).await?)
    }

    /// One page of a listing.
    pub async fn list_objects(&self, bucket: &str, q: &ListQuery) -> Result<ListPage, NodeError> {
        Ok(self.backend.list_objects(bucket, q).await?)
    }

    /// The backend's metadata of an object (not the cache's: attributes and ACLs).
    pub async fn head_object(&self, bucket: &str, key: &str) -> Result<ObjectMeta, NodeError> {
        Ok(self.backend.head_object(bucket, key).await?)
    }

    /// The parts an object was completed from, where the backend knows them.
    pub async fn parts_of(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Option<ObjectParts>, NodeError> {
        Ok(self.backend.parts_of(bucket, key).await?)
    }

    /// Where part `n` (from 1) of an object lies.
    pub async fn part_of(&self, bucket: &str, key: &str, n: usize) -> Result<PartOf, NodeError> {
        Ok(self.backend.part_of(bucket, key, n).await?)
    }

    /// Starts a multipart upload: its id.
    pub async fn create_multipart(
        &self,
        bucket: &str,
        key: &str,
        opts: PutOptions,
    ) -> Result<String, NodeError> {
        check_key(key)?;
        Ok(self.backend.create_multipart(bucket, key, opts).await?)
    }

    pub async fn abort_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<(), NodeError> {
        Ok(self.backend.abort_multipart(bucket, key, upload_id).await?)
    }

    /// The parts an upload in progress has so far.
    pub async fn list_parts(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<Vec<PartInfo>, NodeError> {
        Ok(self.backend.list_parts(bucket, key, upload_id).await?)
    }

    pub async fn list_uploads(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> Result<Vec<UploadInfo>, NodeError> {
        Ok(self.backend.list_uploads(bucket, prefix).await?)
    }
}
