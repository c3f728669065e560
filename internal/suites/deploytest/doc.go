// Package deploytest holds no code, only tests: they check the container
// and deployment files at the repository root (Dockerfile, .dockerignore,
// docker-compose.yml, deploy/) for the properties docs/deploy.md promises,
// and run the Dockerfile's build step and `docker-compose config`. There is
// no container engine in CI, so nothing here starts a container.
package deploytest
