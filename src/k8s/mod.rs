//! Everything that speaks to the Kubernetes API: conversion of its objects, the client, the watches.
//! This is the only module that imports kube.

pub mod convert;
